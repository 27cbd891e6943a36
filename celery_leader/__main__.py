"""``python -m celery_leader status|resign|check|plan|run|entries|console``: the ``leader``
commands without Celery, with settings from ``CELERY_LEADER_*`` environment variables.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import logging
import os
import sys
from collections.abc import Sequence
from datetime import timezone
from typing import Any

from .cli import commands as ops
from .cli import entries as ops_entries
from .exceptions import ConfigError, MissingExtra
from .run.spec import RESTART
from .schedule import plan as planning
from .schedule.run_request import DEFAULT_WAIT
from .settings.config import LeaderConfig, env_name


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m celery_leader",
        description="Leader elections of celery-leader: who leads, hand-over, health. "
        "Settings come from CELERY_LEADER_* environment variables.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser(
        "status",
        help="holder, epoch, time left and term start of every election",
        description="Exit codes: 0 a leader exists (with ELECTIONs: each has one), "
        "3 nobody leads, 2 store unreachable or bad settings.",
    )
    status.add_argument("elections", nargs="*", metavar="ELECTION")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    resign = commands.add_parser("resign", help="ask the holder of ELECTION to hand over")
    resign.add_argument("election", nargs="?", metavar="ELECTION")
    resign.add_argument("--no-wait", action="store_true", help="do not wait for the next holder")
    check = commands.add_parser("check", help="liveness probe: read the health file, exit 0 or 1")
    check.add_argument("--max-age", type=float, help="fail when the file is older (seconds)")
    default = env_name("leader_health_file")
    check.add_argument("--file", dest="path", help=f"health file (default: ${default})")
    plan = commands.add_parser(
        "plan",
        help="list the slots a Dramatiq app's scheduler would send in a window",
        description="As a leader promoted at --from that leads without a break: every entry "
        "starts at --from, or with --stored where the store says it stopped. Sends nothing.",
    )
    plan.add_argument("broker", metavar="MODULE", help="module (or module:broker) of the broker")
    plan.add_argument("modules", nargs="*", metavar="MODULES", help="more modules with actors")
    plan.add_argument("--from", dest="start", required=True, help="ISO 8601 time or 'now'")
    plan.add_argument("--to", dest="end", required=True, help="ISO 8601 time or 'now'")
    plan.add_argument("--tz", help="zone of local times, in and out (default: UTC)")
    plan.add_argument("--stored", action="store_true", help="start from the state in the store")
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plan.add_argument("--path", "-P", action="append", default=[], help="add to sys.path")
    run = commands.add_parser(
        "run",
        help="run CMD on one replica only: the one that leads ELECTION",
        description="Campaigns for ELECTION and runs CMD only while leading, with "
        "LEADER_EPOCH and LEADER_ELECTION set; stops CMD's process group before the "
        "lease can pass to another replica. Exit codes: CMD's own when it ends the run, "
        "0 after SIGTERM/SIGINT/SIGHUP, 2 bad arguments or settings.",
    )
    run.add_argument("--election", required=True, help="the election (one per singleton)")
    run.add_argument("--url", help=f"store URL (default: ${env_name('leader_url')})")
    run.add_argument("--ttl", type=float, help=f"lease ttl, s (default: ${env_name('leader_ttl')})")
    run.add_argument("--grace", type=float, help="seconds from SIGTERM to SIGKILL (bounded by ttl)")
    restart = "when CMD exits on its own: start it again, or resign and exit (default: never)"
    run.add_argument("--restart", choices=RESTART, default="never", help=restart)
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS ...]")
    _entries_parser(commands)
    console = commands.add_parser("console", help="serve the console (a web page)")
    console.add_argument("app", metavar="MODULE", help="module (or module:broker) of the broker")
    console.add_argument("--port", type=int, default=5555, help="the port (default 5555)")
    console.add_argument("--bind", default="127.0.0.1", help="the address (default 127.0.0.1)")
    console.add_argument("--path", "-P", action="append", default=[], help="add to sys.path")
    return parser


def _entries_parser(commands: Any) -> None:
    entries = commands.add_parser(
        "entries",
        help="schedule entries kept in the store: add, ls, show, rm, pause, resume, run, ...",
        description="Exit codes: 0 done, 2 bad input, a refused edit or an unreachable store "
        "(one line on stderr, nothing stored); run: 0 sent, 2 not run, 3 no answer yet.",
    )
    entries.add_argument(
        "--app", required=True, metavar="MODULE", help="module (or module:broker) of the broker"
    )
    entries.add_argument("--path", "-P", action="append", default=[], help="add to sys.path")
    sub = entries.add_subparsers(dest="entries_command", required=True)
    add = sub.add_parser("add", help="add entry NAME (exit 2 if it exists, unless --replace)")
    add.add_argument("name", metavar="NAME")
    add.add_argument("--task", required=True, help="the actor to send")
    add.add_argument("--every", help="every SECONDS, on a grid of the period since the epoch")
    add.add_argument("--cron", help='a 5-field cron expression, e.g. "*/5 * * * *"')
    add.add_argument("--tz", help="the zone --cron is read in (default UTC)")
    add.add_argument("--at", help="one run at this ISO 8601 instant")
    add.add_argument("--args", help="positional arguments: a JSON array")
    add.add_argument("--kwargs", help="keyword arguments: a JSON object")
    add.add_argument("--queue", help="the queue to send to")
    add.add_argument("--missed-slots", choices=("once", "skip", "all"), help="its policy")
    add.add_argument("--late-after", help="SECONDS after its due time a slot not started is late")
    add.add_argument("--max-runtime", help="SECONDS a slot may run before it is overrun")
    add.add_argument("--paused", action="store_true", help="add it paused")
    add.add_argument("--replace", action="store_true", help="redefine it if it exists")
    add.add_argument("--strict", action="store_true", help="refuse an actor the app lacks")
    _audited(add)
    for name, text in (
        ("ls", "list code and store entries"),
        ("export", "print the store entries as JSON lines"),
    ):
        listing = sub.add_parser(name, help=text)
        listing.add_argument("--json", dest="as_json", action="store_true", help="print JSON")
    show = sub.add_parser("show", help="show entry NAME")
    show.add_argument("name", metavar="NAME")
    show.add_argument("--json", dest="as_json", action="store_true", help="print JSON")
    for name, text in (
        ("rm", "remove store entry NAME"),
        ("resume", "send NAME again, from now"),
    ):
        edit = sub.add_parser(name, help=text)
        edit.add_argument("name", metavar="NAME")
        _audited(edit)
    pause = sub.add_parser("pause", help="stop sending NAME until resumed, or until --until")
    pause.add_argument("name", metavar="NAME")
    pause.add_argument("--reason", "--why", dest="why", help="why it is paused (kept with it)")
    pause.add_argument("--until", help="ISO 8601 time it runs again by itself")
    pause.add_argument("--who", help="who pauses it, for the audit trail (default: user@host)")
    run = sub.add_parser("run", help="ask the leader to send one run of NAME now, off its grid")
    run.add_argument("name", metavar="NAME")
    run.add_argument("--key", help="idempotency key: a request made again with it runs once")
    run.add_argument(
        "--wait",
        type=float,
        default=DEFAULT_WAIT,
        help=f"seconds to wait for the leader's answer (default {DEFAULT_WAIT:g})",
    )
    _audited(run)
    run.add_argument("--json", dest="as_json", action="store_true", help="print JSON")
    imp = sub.add_parser("import", help="add the entries of FILE (JSON lines) or of redbeat")
    imp.add_argument("file", nargs="?", type=argparse.FileType("r"), metavar="FILE")
    imp.add_argument("--from-redbeat", metavar="REDIS_URL", help="read redbeat's entries")
    imp.add_argument("--prefix", default="redbeat", help="redbeat's key prefix")
    imp.add_argument("--dry-run", action="store_true", help="list them, store nothing")
    imp.add_argument("--replace", action="store_true", help="redefine entries that exist")
    _audited(imp)


def _audited(parser: Any) -> None:
    """``--why`` and ``--who``: what the audit trail keeps of a change."""
    parser.add_argument("--why", help="why, for the audit trail")
    parser.add_argument("--who", help="who makes the change (default: user@host)")


def _entries(args: argparse.Namespace, echo: ops.Echo) -> int:
    # The Dramatiq side is imported only here: the other commands need no extra.
    dramatiq_entries = importlib.import_module("celery_leader.dramatiq.entries")
    sys.path[:0] = [*args.path, os.getcwd()]
    app = dramatiq_entries.load(args.app)
    command, given = args.entries_command, vars(args)
    audit: dict[str, Any] = {k: given[k] for k in ("why", "who") if k in given}
    if command == "add":
        names = inspect.signature(ops_entries.add_fields).parameters
        fields = ops_entries.add_fields(**{name: given[name] for name in names})
        given = {"fields": fields, "replace": args.replace, "strict": args.strict, **audit}
    elif command == "import" and args.from_redbeat is not None:
        command = "from-redbeat"
        given = {k: given[k] for k in ("prefix", "dry_run", "replace")}
        given.update(url=args.from_redbeat, **audit)
    elif command == "import":
        if args.file is None:
            raise ConfigError("give FILE (JSON lines) or --from-redbeat URL")
        given = {"lines": list(args.file), "replace": args.replace, **audit}
    elif command == "run":
        given = {**{k: given[k] for k in ("name", "key", "wait", "as_json")}, **audit}
    else:
        given = {k: v for k, v in given.items() if k in ("name", "as_json", "until", *audit)}
    return ops_entries.run_command(app, echo, command, **given)


def _console(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # Imported only here: the other commands need neither Dramatiq nor Jinja2.
    dramatiq_entries = importlib.import_module("celery_leader.dramatiq.entries")
    web = importlib.import_module("celery_leader.console")
    sys.path[:0] = [*args.path, os.getcwd()]
    try:
        web.serve(web.console_app(dramatiq_entries.load(args.app)), args.bind, args.port)
    except OSError as exc:  # its port is taken, or its address is not this host's
        raise ConfigError(f"the console cannot listen on {args.bind}:{args.port}: {exc}") from None
    return 0


def _run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    names = {"leader_url": "--url", "leader_ttl": "--ttl"}
    config = LeaderConfig.from_env(leader_url=args.url, leader_ttl=args.ttl, names=names)
    return ops.run(config, args.election, command, args.grace, args.restart)


def _plan(args: argparse.Namespace, echo: ops.Echo) -> int:
    # The Dramatiq side is imported only here: the other commands need no extra.
    dramatiq_plan = importlib.import_module("celery_leader.dramatiq.plan")
    zone = timezone.utc if args.tz is None else planning.parse_zone(args.tz)
    jobs, config = dramatiq_plan.app_jobs(args.broker, args.modules, args.path, args.stored)
    return ops.plan(config, echo, jobs, (args.start, args.end), zone, args.stored, args.json)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code."""
    args = _parser().parse_args(argv)
    echo = functools.partial(print, flush=True)
    if args.command == "check":
        path = args.path or os.environ.get(env_name("leader_health_file"))
        return ops.check(path, echo, args.max_age)
    try:
        if args.command == "plan":
            return _plan(args, echo)
        if args.command == "run":
            return _run(args)
        if args.command == "entries":
            return _entries(args, echo)
        if args.command == "console":
            return _console(args)
        config = LeaderConfig.from_env()
        if args.command == "status":
            return ops.status(config, echo, args.elections, args.json)
        return ops.resign(config, echo, args.election, not args.no_wait)
    except (ConfigError, MissingExtra, planning.PlanError, ops_entries.EntriesError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return ops.EXIT_UNKNOWN
    except ops.OpsError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return exc.code



if __name__ == "__main__":
    sys.exit(main())
