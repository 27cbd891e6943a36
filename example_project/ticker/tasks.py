"""Tasks of the example project.

Every run is appended to ``DATA/ledger.jsonl`` with the slot and epoch that
beat stamped on the message, so the quickstart can show who sent what.
"""

import json
import os
import time

from celery import current_task, shared_task
from django.conf import settings

from celery_leader import NotLeader, current_epoch, ensure_leader, leader_only


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
    """Runs once, on the worker that leads the ``worker`` election.

    Sent from anywhere (beat, ``delay()``), it goes to the election's leader
    queue, which only the leading worker consumes.
    """
    _record("nightly_report", current_task.request)


@shared_task
@leader_only
def rebuild_index(chunks: int = 10) -> int:
    """A long body that checks, between chunks, that it still leads.

    The check at the start of a body does not stop a body that is already
    running when its worker loses leadership (paused, cut off, demoted).
    ``ensure_leader()`` costs a clock read and a memory read: call it before
    each side effect. ``current_epoch()`` is the fencing token of the term the
    body started under; a store that keeps the highest token it has seen can
    refuse a deposed leader's late write even if it slipped past the check.
    Returns the number of chunks written.
    """
    epoch = current_epoch()
    done = 0
    try:
        for chunk in range(chunks):
            ensure_leader()  # raises NotLeader once leadership is gone
            _write_chunk(chunk, epoch)
            done += 1
    except NotLeader:
        # Stop here: the new leader runs the work from its own trigger.
        pass
    return done


def _write_chunk(chunk: int, epoch: int | None) -> None:
    line = json.dumps({"task": "rebuild_index", "chunk": chunk, "epoch": epoch})
    fd = os.open(settings.DATA / "index.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
    time.sleep(0.1)  # stands for real work
