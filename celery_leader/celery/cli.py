"""``celery -A proj leader status|resign|check|plan|run|entries|console``: see and steer
the elections (what each command does lives in :mod:`celery_leader.cli.commands`)."""

from __future__ import annotations

import importlib
import logging
from typing import NoReturn

from ..cli import commands as ops
from ..exceptions import ConfigError, MissingExtra, missing_extra
from ..run.spec import RESTART
from ..schedule import plan as planning
from ..settings.config import SETTINGS, LeaderConfig
from . import ledger as _ledger  # noqa: F401  # connects the run ledger's worker step
from . import startup
from .beat import LeaderScheduler
from .entries import entries, entries_app

try:
    import click
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "celery") from None


def _config(ctx: click.Context) -> LeaderConfig:
    try:
        return LeaderConfig.from_app(ctx.obj.app)
    except ConfigError as exc:
        # One line on stderr (a UsageError would print click's usage lines first).
        raise startup.for_cli(exc) from None


def _fail(exc: ops.OpsError) -> NoReturn:
    click.echo(f"Error: {exc}", err=True)
    raise SystemExit(exc.code)


@click.group(name="leader")
def leader() -> None:
    """Leader elections of celery-leader: who leads, hand-over, health."""


@leader.command()
@click.argument("elections", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def status(ctx: click.Context, elections: tuple[str, ...], as_json: bool) -> None:
    """Print holder, epoch, time left and term start of every election (or of ELECTIONS).

    Exits 0 when a leader exists (with ELECTIONS: when each of them has one),
    3 when nobody leads, 2 when the store is unreachable.
    """
    config = _config(ctx)
    try:
        code = ops.status(config, click.echo, elections, as_json)
    except ops.OpsError as exc:
        _fail(exc)
    raise SystemExit(code)


@leader.command()
@click.argument("election", required=False)
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait for the next holder.")
@click.pass_context
def resign(ctx: click.Context, election: str | None, wait: bool) -> None:
    """Ask the holder of ELECTION (default: the beat election) to hand over.

    The holder steps down at its next renewal and sits out one renew
    interval, so another instance takes over.
    """
    config = _config(ctx)
    try:
        ops.resign(config, click.echo, election, wait)
    except ops.OpsError as exc:
        _fail(exc)


@leader.command()
@click.option("--max-age", type=float, help="Fail when the file is older (default: its own bound).")
@click.option("--file", "path", help="Health file (default: the leader_health_file setting).")
@click.pass_context
def check(ctx: click.Context, max_age: float | None, path: str | None) -> None:
    """Liveness probe: read the health file, print one line, exit 0 (healthy) or 1."""
    if path is None:
        try:
            path = LeaderConfig.from_app(ctx.obj.app).health_file
        except ConfigError as exc:
            click.echo(f"UNHEALTHY: {exc}")
            raise SystemExit(ops.EXIT_FAILED) from exc
    raise SystemExit(ops.check(path, click.echo, max_age))


@leader.command()
@click.option("--from", "start", required=True, help="ISO 8601 time or 'now'.")
@click.option("--to", "end", required=True, help="ISO 8601 time or 'now'.")
@click.option("--tz", help="Zone of local times, in and out (default: the app's timezone).")
@click.option("--stored", is_flag=True, help="Start from the state in the store.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def plan(
    ctx: click.Context, start: str, end: str, tz: str | None, stored: bool, as_json: bool
) -> None:
    """List the slots the beat leader would send after --from, up to --to.

    As a leader promoted at --from that leads without a break: every entry
    starts at --from, or with --stored where the store says it stopped (then
    the missed-slot policy decides what is sent late at --from). Sends nothing.
    """
    config = _config(ctx)
    app = ctx.obj.app
    try:
        zone = app.timezone if tz is None else planning.parse_zone(tz)
        scheduler = LeaderScheduler(app=app, lazy=True)
        jobs = scheduler.leader_jobs(store_entries=stored)
        code = ops.plan(config, click.echo, jobs, (start, end), zone, stored, as_json)
    except planning.PlanError as exc:
        _fail(ops.OpsError(str(exc), ops.EXIT_UNKNOWN))
    except ops.OpsError as exc:
        _fail(exc)
    raise SystemExit(code)


@leader.command(context_settings={"ignore_unknown_options": True})
@click.option("--election", required=True, help="The election (one per singleton).")
@click.option("--url", help="Store URL (default: the leader_url setting).")
@click.option("--ttl", type=float, help="Lease ttl in seconds (default: the leader_ttl setting).")
@click.option("--grace", type=float, help="Seconds from SIGTERM to SIGKILL (bounded by the ttl).")
@click.option(
    "--restart",
    type=click.Choice(RESTART),
    default="never",
    show_default=True,
    help="When CMD exits on its own: start it again, or resign and exit.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run(
    ctx: click.Context,
    election: str,
    url: str | None,
    ttl: float | None,
    grace: float | None,
    restart: str,
    command: tuple[str, ...],
) -> None:
    """Run CMD (after --) on one replica only: the one that leads ELECTION.

    CMD gets LEADER_EPOCH and LEADER_ELECTION, and its whole process group is
    stopped before the lease can pass to another replica. Exits with CMD's own
    status when it ends the run, 0 after SIGTERM/SIGINT/SIGHUP, 2 on bad input.
    """
    conf = ctx.obj.app.conf
    values = {key: conf.get(key) for key in SETTINGS}
    given = {"leader_url": url, "leader_ttl": ttl}
    values.update({key: value for key, value in given.items() if value is not None})
    names = {key: f"--{key[len('leader_') :]}" for key, value in given.items() if value is not None}
    try:
        config = LeaderConfig.from_mapping(values, broker_url=conf.get("broker_url"), names=names)
    except ConfigError as exc:
        _fail(ops.OpsError(str(exc), ops.EXIT_UNKNOWN))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        code = ops.run(config, election, command, grace, restart)
    except ops.OpsError as exc:
        _fail(exc)
    raise SystemExit(code)


@leader.command()
@click.option("--port", type=int, default=5555, show_default=True, help="The port to listen on.")
@click.option(
    "--bind", default="127.0.0.1", show_default=True, help="The address to listen on."
)
@click.pass_context
def console(ctx: click.Context, port: int, bind: str) -> None:
    """Serve the console: a web page of the elections, the entries and their runs.

    Read-only unless leader_console_write and leader_console_token are set; it
    refuses an address other than loopback without leader_console_token. Needs
    celery-leader[console].
    """
    _config(ctx)  # bad settings fail here, in one line
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        # Imported only here: Celery loads this module for every command, and
        # the console's extra (Jinja2) is needed by this one only.
        web = importlib.import_module("celery_leader.console")
        web.serve(web.console_app(entries_app(ctx.obj.app)), bind, port)
    except (ConfigError, MissingExtra, OSError) as exc:
        _fail(ops.OpsError(str(exc).splitlines()[0], ops.EXIT_UNKNOWN))


leader.add_command(entries)
