"""``python -m celery_leader status|resign|check|plan|run``: the ``leader`` commands without Celery.

Settings come from ``CELERY_LEADER_*`` environment variables
(:meth:`LeaderConfig.from_env`); the output and exit codes are those of
``celery -A proj leader ...`` (both run :mod:`celery_leader.ops`). ``plan``
lists the slots of a Dramatiq app, with the settings of its ``LeaderMiddleware``;
``run`` runs a command on one replica only (:mod:`celery_leader.run`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from datetime import timezone

from . import ops
from .config import LeaderConfig, env_name
from .exceptions import ConfigError, MissingExtra
from .run.spec import RESTART
from .schedule import plan as planning


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
    check.add_argument(
        "--file",
        dest="path",
        help=f"health file (default: ${env_name('leader_health_file')})",
    )
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
    run.add_argument(
        "--restart",
        choices=RESTART,
        default="never",
        help="when CMD exits on its own: start it again, or resign and exit (default: never)",
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS ...]")
    return parser


def _run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    config = LeaderConfig.from_env(
        leader_url=args.url,
        leader_ttl=args.ttl,
        names={"leader_url": "--url", "leader_ttl": "--ttl"},
    )
    return ops.run(config, args.election, command, args.grace, args.restart)


def _plan(args: argparse.Namespace, echo: ops.Echo) -> int:
    # The Dramatiq side is imported only here: the other commands need no extra.
    dramatiq_plan = importlib.import_module("celery_leader.dramatiq.plan")
    zone = timezone.utc if args.tz is None else planning.parse_zone(args.tz)
    jobs, config = dramatiq_plan.app_jobs(args.broker, args.modules, args.path)
    return ops.plan(config, echo, jobs, (args.start, args.end), zone, args.stored, args.json)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code."""
    args = _parser().parse_args(argv)

    def echo(line: str) -> None:
        print(line, flush=True)

    if args.command == "check":
        path = args.path or os.environ.get(env_name("leader_health_file"))
        return ops.check(path, echo, args.max_age)
    try:
        if args.command == "plan":
            return _plan(args, echo)
        if args.command == "run":
            return _run(args)
        config = LeaderConfig.from_env()
        if args.command == "status":
            return ops.status(config, echo, args.elections, args.json)
        return ops.resign(config, echo, args.election, not args.no_wait)
    except (ConfigError, MissingExtra, planning.PlanError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return ops.EXIT_UNKNOWN
    except ops.OpsError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
