"""``celery -A proj leader entries ...`` and :func:`entries_of`: Celery's side of the
schedule entries kept in the store (the commands are :mod:`celery_leader.cli.entries`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from ..cli import entries as ops_entries
from ..cli.entries import CodeEntry, EntriesApp, EntriesError, ScheduleEntries
from ..exceptions import ConfigError, missing_extra
from ..schedule.run_request import DEFAULT_WAIT
from ..settings.config import LeaderConfig
from .adapter import series_of

try:
    import click
    from celery import current_app
    from celery.schedules import crontab, maybe_schedule
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "celery") from None


def entries_app(app: Any) -> EntriesApp:
    """What the entries commands need of Celery app ``app``."""
    config = LeaderConfig.from_app(app)
    code = {}
    for name, spec in (app.conf.beat_schedule or {}).items():
        sched = maybe_schedule(spec.get("schedule"), app=app)
        code[name] = CodeEntry(
            task=spec.get("task", ""),
            schedule=_text(sched),
            series=series_of(sched, config.crontab_dst),
            args=tuple(spec.get("args") or ()),
            kwargs=dict(spec.get("kwargs") or {}),
            options=dict(spec.get("options") or {}),
        )

    app.loader.import_default_modules()
    tasks = {name for name in app.tasks if not name.startswith("celery.")}
    return EntriesApp(config, code, tasks, zone=str(app.conf.timezone or "UTC"))


def current_entries_app() -> EntriesApp:
    """:func:`entries_app` of the current Celery app: a Django project's, which its
    ``proj/__init__.py`` imports (the console mounted in Django uses it)."""
    return entries_app(current_app._get_current_object())


def entries_of(app: Any) -> ScheduleEntries:
    """The Python API of the entries kept in the store for Celery app ``app``.

    ``with entries_of(app) as entries: entries.add("report-42", "proj.report",
    every=3600, kwargs={"customer": 42})``.
    """
    return ScheduleEntries(entries_app(app))


def _text(sched: Any) -> str:
    if isinstance(sched, crontab):
        fields = (
            sched._orig_minute,
            sched._orig_hour,
            sched._orig_day_of_month,
            sched._orig_month_of_year,
            sched._orig_day_of_week,
        )
        return f'crontab "{" ".join(str(f) for f in fields)}"'
    run_every = getattr(sched, "run_every", None)
    if run_every is not None:
        return f"every {run_every.total_seconds():g}s"
    return repr(sched)


def _run(ctx: click.Context, command: str, **args: Any) -> NoReturn:
    try:
        app = entries_app(ctx.obj.app)
        code = ops_entries.run_command(app, click.echo, command, **args)
    except (EntriesError, ConfigError) as exc:
        click.echo(f"Error: {exc}", err=True)
        raise SystemExit(2) from None
    raise SystemExit(code)


def _audited(command: Callable[..., None]) -> Callable[..., None]:
    """``--why`` and ``--who``: what the audit trail keeps of a change."""
    command = click.option(
        "--who", help="Who makes the change, for the audit trail (default: user@host)."
    )(command)
    return click.option("--why", help="Why, for the audit trail.")(command)


@click.group(name="entries")
def entries() -> None:
    """Schedule entries kept in the store: added, paused and removed at runtime."""


@entries.command()
@click.argument("name")
@click.option("--task", required=True, help="The task to send.")
@click.option("--every", help="Every SECONDS, on a grid of the period since the epoch.")
@click.option("--cron", help='A 5-field cron expression, e.g. "*/5 * * * *".')
@click.option("--tz", help="The zone --cron is read in (default UTC).")
@click.option("--at", help="One run at this ISO 8601 instant.")
@click.option("--args", "args_json", help="Positional arguments: a JSON array.")
@click.option("--kwargs", "kwargs_json", help="Keyword arguments: a JSON object.")
@click.option("--queue", help="The queue to send to.")
@click.option("--missed-slots", type=click.Choice(["once", "skip", "all"]), help="Its policy.")
@click.option("--late-after", help="SECONDS after its due time a slot not started is late.")
@click.option("--max-runtime", help="SECONDS a slot may run before it is overrun.")
@click.option("--paused", is_flag=True, help="Add it paused.")
@click.option("--replace", is_flag=True, help="Redefine it if it exists.")
@click.option("--strict", is_flag=True, help="Refuse a task this app does not know.")
@_audited
@click.pass_context
def add(
    ctx: click.Context,
    name: str,
    task: str,
    every: str | None,
    cron: str | None,
    tz: str | None,
    at: str | None,
    args_json: str | None,
    kwargs_json: str | None,
    queue: str | None,
    missed_slots: str | None,
    late_after: str | None,
    max_runtime: str | None,
    paused: bool,
    replace: bool,
    strict: bool,
    why: str | None,
    who: str | None,
) -> None:
    """Add entry NAME (exit 2 if it exists, unless --replace)."""
    try:
        fields = ops_entries.add_fields(
            name,
            task,
            every,
            cron,
            tz,
            at,
            args_json,
            kwargs_json,
            queue,
            paused,
            missed_slots,
            late_after,
            max_runtime,
        )
    except ConfigError as exc:
        click.echo(f"Error: {exc}", err=True)
        raise SystemExit(2) from None
    _run(ctx, "add", fields=fields, replace=replace, strict=strict, why=why, who=who)


@entries.command(name="ls")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def ls(ctx: click.Context, as_json: bool) -> None:
    """List code and store entries: source, schedule, enabled, next due, last slot sent."""
    _run(ctx, "ls", as_json=as_json)


@entries.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def show(ctx: click.Context, name: str, as_json: bool) -> None:
    """Show entry NAME."""
    _run(ctx, "show", name=name, as_json=as_json)


@entries.command()
@click.argument("name")
@_audited
@click.pass_context
def rm(ctx: click.Context, name: str, why: str | None, who: str | None) -> None:
    """Remove store entry NAME (a code entry cannot be removed: pause it)."""
    _run(ctx, "rm", name=name, why=why, who=who)


@entries.command()
@click.argument("name")
@click.option("--reason", "--why", "why", help="Why it is paused (kept with the pause).")
@click.option("--until", help="ISO 8601 time it runs again by itself (default: when resumed).")
@click.option("--who", help="Who pauses it, for the audit trail (default: user@host).")
@click.pass_context
def pause(
    ctx: click.Context, name: str, why: str | None, until: str | None, who: str | None
) -> None:
    """Stop sending NAME (a store or a code entry) until resumed, or until --until."""
    _run(ctx, "pause", name=name, why=why, until=until, who=who)


@entries.command()
@click.argument("name")
@_audited
@click.pass_context
def resume(ctx: click.Context, name: str, why: str | None, who: str | None) -> None:
    """Send NAME again, from now (nothing for the time it was paused)."""
    _run(ctx, "resume", name=name, why=why, who=who)


@entries.command(name="run")
@click.argument("name")
@click.option("--key", help="Idempotency key: a request made again with it runs once.")
@click.option(
    "--wait",
    type=float,
    default=DEFAULT_WAIT,
    show_default=True,
    help="Seconds to wait for the leader's answer.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_audited
@click.pass_context
def run_now(
    ctx: click.Context,
    name: str,
    key: str | None,
    wait: float,
    as_json: bool,
    why: str | None,
    who: str | None,
) -> None:
    """Ask the leader to send one run of NAME now, outside its grid (leader_slot
    NAME@run:<time>), with its options; exit 0 sent, 2 not run, 3 no answer yet."""
    _run(ctx, "run", name=name, key=key, wait=wait, as_json=as_json, why=why, who=who)


@entries.command(name="export")
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of JSON lines.")
@click.pass_context
def export(ctx: click.Context, as_json: bool) -> None:
    """Print the store entries as JSON lines (what import reads)."""
    _run(ctx, "export", as_json=as_json)


@entries.command(name="import")
@click.argument("file", required=False, type=click.File("r"))
@click.option("--from-redbeat", "redbeat_url", help="Read redbeat's entries from this Redis URL.")
@click.option("--prefix", default="redbeat", show_default=True, help="redbeat's key prefix.")
@click.option("--dry-run", is_flag=True, help="List what would be imported; store nothing.")
@click.option("--replace", is_flag=True, help="Redefine entries that exist.")
@_audited
@click.pass_context
def import_(
    ctx: click.Context,
    file: Any,
    redbeat_url: str | None,
    prefix: str,
    dry_run: bool,
    replace: bool,
    why: str | None,
    who: str | None,
) -> None:
    """Add the entries of FILE (JSON lines; - for stdin), or of a redbeat schedule."""
    audit = {"why": why, "who": who}
    if redbeat_url is not None:
        _run(
            ctx,
            "from-redbeat",
            url=redbeat_url,
            prefix=prefix,
            dry_run=dry_run,
            replace=replace,
            **audit,
        )
    if file is None:
        click.echo("Error: give FILE (JSON lines) or --from-redbeat URL", err=True)
        raise SystemExit(2)
    _run(ctx, "import", lines=list(file), replace=replace, **audit)
