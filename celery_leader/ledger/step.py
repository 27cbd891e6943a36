"""A worker's ledger step without its framework: what the Celery and Dramatiq hooks share."""

from __future__ import annotations

import logging
import threading
import time

from ..backends import open_store
from ..exceptions import StoreUnavailable
from ..probes import metrics
from ..settings.config import OVERLAP, LeaderConfig
from . import marks
from .crons import SentryCrons
from .guard import Decision, RunGuard
from .records import FAILURE, WORKERS
from .target import LedgerTarget

logger = logging.getLogger(__name__)


def build_guard(config: LeaderConfig) -> RunGuard:
    """A run guard for this process, on the store and beat election of ``config``."""
    keeping = (config.ttl, config.renew_interval, config.ledger_retention, config.ledger_keep)
    runs, election = open_store(config).runs, config.beat_election
    target = LedgerTarget(runs, election, config.instance_id, *keeping)
    guard = RunGuard(target, config.on_redelivery)
    if config.sentry_crons:
        guard.crons = SentryCrons()
    return guard


def begin(
    guard: RunGuard,
    config: LeaderConfig,
    slot: str,
    retry: bool,
    overlap: object,
    epoch: object = None,
) -> Decision | None:
    """Record ``slot`` started, or decide it is not run (logged and counted); ``overlap`` and
    ``epoch`` (``leader_epoch``) as the message carries them. ``None`` when the store cannot
    say: the body runs unrecorded."""
    chosen = overlap if isinstance(overlap, str) and overlap in OVERLAP else config.overlap
    sent_under = epoch if type(epoch) is int else None
    try:
        decision = guard.begin(slot, retry, chosen, config.overlap_wait, sent_under)
    except StoreUnavailable as exc:
        logger.warning("celery-leader: slot %s runs unrecorded in the run ledger: %s", slot, exc)
        return None
    if decision.counter is not None:
        metrics.count(decision.counter, guard.target.election)
    if not decision.run:
        logger.info("celery-leader: slot %s not run: %s", slot, decision.why)
    return decision


def failed(guard: RunGuard, slot: str) -> None:
    """Record that ``slot``'s body failed for good (no retry follows), and count it."""
    guard.finish(slot, FAILURE)
    metrics.count("ledger_failures", guard.target.election)


#: The ``@ledger-workers`` mark lives this many ``leader_ttl`` after its last
#: renewal (renewed every ttl): once the last worker with the dedup step stops,
#: or turns it off, beat stops re-sending within a few ttl.
WORKERS_MARK_TTLS = 3


def register(config: LeaderConfig, worker: str) -> None:
    """Keep the ledger's ``@ledger-workers`` mark alive from a daemon thread: beat re-sends
    slots only while it exists. The store client is built here, so a store that cannot be
    built fails the caller (at worker start, in one line) instead of the thread."""
    runs = open_store(config).runs
    what: dict[str, object] = {"worker": worker}
    lifetime = WORKERS_MARK_TTLS * config.ttl

    def loop() -> None:
        while True:
            try:
                marks.touch(runs, config.beat_election, WORKERS, what, lifetime)
            except Exception as exc:
                # A thread that died here would end the registration silently,
                # and beat would stop re-sending what it cannot confirm.
                logger.warning("celery-leader: could not register in the run ledger: %s", exc)
            time.sleep(config.ttl)

    threading.Thread(target=loop, name="celery-leader ledger mark", daemon=True).start()
