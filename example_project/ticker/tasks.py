"""Tasks of the example project.

Every run is appended to ``DATA/ledger.jsonl`` with the slot and epoch that
beat stamped on the message, so the quickstart can show who sent what.
"""

import json
import os
import time

from celery import current_task, shared_task
from django.conf import settings

from celery_leader import leader_only


def _record(task: str, request: object) -> None:
    line = json.dumps(
        {
            "task": task,
            "slot": getattr(request, "leader_slot", None),
            "epoch": getattr(request, "leader_epoch", None),
            "worker": getattr(request, "hostname", None),
            "ran_at": time.time(),
        }
    )
    # One short O_APPEND write per line: concurrent workers never interleave.
    fd = os.open(settings.DATA / "ledger.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@shared_task(bind=True)
def heartbeat(self) -> None:
    """Scheduled from ``CELERY_BEAT_SCHEDULE`` in settings."""
    _record("heartbeat", self.request)


@shared_task(bind=True)
def db_tick(self) -> None:
    """Scheduled from django-celery-beat's tables (see migration 0001)."""
    _record("db_tick", self.request)


@shared_task
@leader_only
def nightly_report() -> None:
    """Runs only on the worker that leads the ``worker`` election; others skip it.

    Send it to every worker (or from beat): the body runs once, on the leader.
    """
    _record("nightly_report", current_task.request)
