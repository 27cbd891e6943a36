"""The audit trail's records and logs, on the memory store's journal."""

from __future__ import annotations

import uuid

from celery_leader.backends import open_store
from celery_leader.schedule.audit import AuditRecord, audit_trail, local_actor, record_change
from celery_leader.settings.config import LeaderConfig


def _journal():  # type: ignore[no-untyped-def]
    url = f"memory://audit-{uuid.uuid4().hex[:8]}"
    return open_store(LeaderConfig.from_mapping({"leader_url": url})).journal


def test_a_change_is_in_the_elections_trail_and_its_entrys_newest_first_in_pages() -> None:
    journal = _journal()
    for n, (action, entry) in enumerate([("add", "a"), ("pause", "b"), ("resume", "a")]):
        record_change(journal, "beat", AuditRecord(100.0 + n, "ops@host", action, entry), 10)
    every = audit_trail(journal, "beat", 10)
    changes = [(r.action, r.entry) for _, r in every]
    assert changes == [("resume", "a"), ("pause", "b"), ("add", "a")]
    assert [r.action for _, r in audit_trail(journal, "beat", 10, entry="a")] == ["resume", "add"]
    first = audit_trail(journal, "beat", 1)
    second = audit_trail(journal, "beat", 1, before=first[0][0])
    assert [r.action for _, r in first + second] == ["resume", "pause"]


def test_each_log_keeps_its_newest_records() -> None:
    journal = _journal()
    for n in range(5):
        record_change(journal, "beat", AuditRecord(float(n), "x", "pause", f"e{n % 2}"), 2)
    assert [r.at for _, r in audit_trail(journal, "beat", 10)] == [4.0, 3.0]
    assert [r.at for _, r in audit_trail(journal, "beat", 10, entry="e0")] == [4.0, 2.0]


def test_records_round_trip_and_unreadable_ones_are_skipped() -> None:
    record = AuditRecord(1.5, "a@b", "pause", "job", "deploy", {"until": 9.0})
    assert AuditRecord.load(record.dump()) == record
    assert AuditRecord.load("[]") is None and AuditRecord.load('{"at": 1}') is None
    assert "@" in local_actor()
