"""``celery -A proj leader entries ...`` and :func:`entries_of`: Celery's side of the
schedule entries kept in the store (the commands are :mod:`celery_leader.cli.entries`)."""

from __future__ import annotations

from typing import Any, NoReturn

from ..cli import entries as ops_entries
from ..cli.entries import CodeEntry, EntriesApp, EntriesError, ScheduleEntries
from ..exceptions import ConfigError, missing_extra
from ..schedule.run_request import DEFAULT_WAIT
from ..settings.config import LeaderConfig
from .adapter import series_of

try:
    import click
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
@click.option("--paused", is_flag=True, help="Add it paused.")
@click.option("--replace", is_flag=True, help="Redefine it if it exists.")
@click.option("--strict", is_flag=True, help="Refuse a task this app does not know.")
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
    paused: bool,
    replace: bool,
    strict: bool,
) -> None:
    """Add entry NAME (exit 2 if it exists, unless --replace)."""
    try:
        fields = ops_entries.add_fields(
            name, task, every, cron, tz, at, args_json, kwargs_json, queue, paused, missed_slots
        )
    except ConfigError as exc:
        click.echo(f"Error: {exc}", err=True)
        raise SystemExit(2) from None
    _run(ctx, "add", fields=fields, replace=replace, strict=strict)


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
@click.pass_context
def rm(ctx: click.Context, name: str) -> None:
    """Remove store entry NAME (a code entry cannot be removed: pause it)."""
    _run(ctx, "rm", name=name)


@entries.command()
@click.argument("name")
@click.pass_context
def pause(ctx: click.Context, name: str) -> None:
    """Stop sending NAME (a store or a code entry) until resumed."""
    _run(ctx, "pause", name=name)


@entries.command()
@click.argument("name")
@click.pass_context
def resume(ctx: click.Context, name: str) -> None:
    """Send NAME again, from now (nothing for the time it was paused)."""
    _run(ctx, "resume", name=name)


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
@click.option("--why", help="The reason, kept in the audit trail.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def run_now(
    ctx: click.Context, name: str, key: str | None, wait: float, why: str | None, as_json: bool
) -> None:
    """Ask the leader to send one run of NAME now, outside its grid (leader_slot
    NAME@run:<time>), with its options; exit 0 sent, 2 not run, 3 no answer yet."""
    _run(ctx, "run", name=name, key=key, wait=wait, why=why, as_json=as_json)


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
@click.pass_context
def import_(
    ctx: click.Context,
    file: Any,
    redbeat_url: str | None,
    prefix: str,
    dry_run: bool,
    replace: bool,
) -> None:
    """Add the entries of FILE (JSON lines; - for stdin), or of a redbeat schedule."""
    if redbeat_url is not None:
        _run(ctx, "from-redbeat", url=redbeat_url, prefix=prefix, dry_run=dry_run, replace=replace)
    if file is None:
        click.echo("Error: give FILE (JSON lines) or --from-redbeat URL", err=True)
        raise SystemExit(2)
    _run(ctx, "import", lines=list(file), replace=replace)
