"""The term history: each lease writes its terms into the store's journal."""

from __future__ import annotations

import uuid

from celery_leader.backends import JournalWrite, open_store
from celery_leader.election.history import TERMS, TermRecord, term_history, term_key
from celery_leader.election.lease_set import lease_set
from celery_leader.settings.config import LeaderConfig
from harness.waiting import wait_for


def _config(url: str, instance: str) -> LeaderConfig:
    return LeaderConfig.from_mapping(
        {"leader_url": url, "leader_ttl": 0.6, "leader_renew_interval": 0.1,
         "leader_instance_id": instance}
    )  # fmt: skip


def test_a_term_is_recorded_when_it_starts_and_completed_when_it_is_released() -> None:
    url = f"memory://history-{uuid.uuid4().hex[:8]}"
    journal = open_store(_config(url, "reader")).journal
    a = lease_set(_config(url, "a"))
    lease = a.join("e").lease
    wait_for(lease.is_leader, 3, message="never elected")
    epoch = lease.epoch
    assert epoch is not None
    wait_for(lambda: term_history(journal, "e", 10), 3, message="the term was not recorded")
    (started,) = term_history(journal, "e", 10)
    assert (started.epoch, started.holder, started.ended, started.how) == (epoch, "a", None, None)
    a.stop()
    (ended,) = term_history(journal, "e", 10)
    assert ended.how == "stopping", "a graceful stop is recorded before stop() returns"
    assert ended.ended is not None and ended.started <= ended.ended


def test_a_term_its_holder_never_completed_is_recorded_as_lost_by_the_next_holder() -> None:
    url = f"memory://history-{uuid.uuid4().hex[:8]}"
    journal = open_store(_config(url, "reader")).journal
    crashed = TermRecord(0, "crashed", 1.0)  # epoch 0: before any term this store gives
    journal.write("e", [JournalWrite(TERMS, term_key(0), crashed.dump(), 10)])
    b = lease_set(_config(url, "b"))
    try:
        lease = b.join("e").lease
        wait_for(lambda: len(term_history(journal, "e", 10)) == 2, 3, message="not recorded")
        mine, lost = term_history(journal, "e", 10)
        assert (mine.holder, mine.epoch, mine.how) == ("b", lease.epoch, None)
        assert (lost.holder, lost.how, lost.ended) == ("crashed", "lost", None)
    finally:
        b.stop()


def test_a_record_this_version_cannot_read_is_skipped() -> None:
    assert TermRecord.load("not json") is None
    assert TermRecord.load('{"epoch": 1}') is None
    record = TermRecord(3, "a", 1.5, 2.5, "resigned")
    assert TermRecord.load(record.dump()) == record
