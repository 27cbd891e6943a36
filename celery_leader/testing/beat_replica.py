"""One ``celery beat`` replica of :func:`celery_leader.testing.beat_replicas`.

``python -m celery_leader.testing.beat_replica --ledger FILE --settings JSON --schedule FILE APP``
runs ``celery beat -S celery_leader.LeaderScheduler`` with the settings applied, and appends
to the ledger ``{"ready": true}`` when beat starts and ``{"slot": ...}`` per message published.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from ..exceptions import missing_extra

try:
    from celery import signals
    from celery.app.utils import find_app
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "celery") from None


def main(argv: list[str] | None = None) -> int:
    """Run one replica until SIGTERM; the exit status of ``celery beat``."""
    parser = argparse.ArgumentParser(prog="python -m celery_leader.testing.beat_replica")
    parser.add_argument("--ledger", required=True, help="file to append JSON lines to")
    parser.add_argument("--settings", default="{}", help="JSON object of app settings")
    parser.add_argument("--schedule", required=True, help="beat's -s (local schedule file)")
    parser.add_argument("app", help="the app, as for celery -A")
    args = parser.parse_args(argv)
    app = find_app(args.app)
    app.conf.update(json.loads(args.settings))
    # Line-buffered, so that each line is on disk when the test reads it, even
    # if this process is killed right after.
    ledger = open(args.ledger, "a", buffering=1)

    def ready(**_: Any) -> None:
        _write(ledger, {"ready": True})

    def published(headers: Any = None, **_: Any) -> None:
        _write(ledger, {"slot": (headers or {}).get("leader_slot")})

    signals.beat_init.connect(ready, weak=False)
    signals.after_task_publish.connect(published, weak=False)
    status = app.start(
        ["beat", "-S", "celery_leader.LeaderScheduler", "-l", "info", "-s", args.schedule]
    )
    return int(status or 0)


def _write(ledger: TextIO, record: dict[str, Any]) -> None:
    ledger.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    sys.exit(main())
