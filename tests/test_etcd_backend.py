"""What is particular to the etcd store: URLs, members failing, quorum, TLS, users and
the journal's transactions.

The protocol itself runs in tests/test_backend_contract.py; replicas through faults in
tests/test_etcd_chaos.py and tests/test_dramatiq_chaos.py.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celery_leader.backends import (
    Edit,
    Fence,
    JournalWrite,
    Renewal,
    StoreFacets,
    Write,
    open_store,
)
from celery_leader.backends.etcd import EtcdJournal, EtcdLock, wire
from celery_leader.backends.etcd import records as etcd_records
from celery_leader.backends.etcd.params import EtcdParams, etcd_params
from celery_leader.exceptions import ConfigError, StoreMisconfigured, StoreUnavailable
from celery_leader.settings.config import LeaderConfig
from harness.etcd import EtcdCluster

TTL = 3.0
TIMEOUT = 0.5
# A login is a bcrypt check of the password on the server, tens of milliseconds of its
# CPU; with many busy sessions on two cores (each server and process runs in one of
# its own, and each session gets an equal share), many times that. So the test of logins
# gives each call the deadline of the default ttl (15 s, renew 5 s), not the 0.5 s the
# deadline tests want: a login that took 0.5 s there failed the test once.
LOGIN_TIMEOUT = 5.0


def store(url: str, timeout: float = TIMEOUT) -> StoreFacets:
    """A store whose calls each have ``timeout`` as their deadline (the renew interval,
    a third of the ttl or less)."""
    config = LeaderConfig.from_mapping(
        {"leader_url": url, "leader_ttl": max(TTL, 3 * timeout), "leader_renew_interval": timeout}
    )
    made = open_store(config)
    assert isinstance(made.lock, EtcdLock) and made.timeout == timeout
    return made


def test_url_forms() -> None:
    assert etcd_params("etcd://h1:2379,h2,[::1]:32379") == EtcdParams(
        (("h1", 2379), ("h2", 2379), ("::1", 32379)), tls=False
    )
    params = etcd_params("etcds://u%40x:p%3Aw@h1?cacert=/ca.pem&cert=/c.pem&key=/k.pem")
    assert (params.tls, params.user, params.password) == (True, "u@x", "p:w")
    assert (params.cacert, params.cert, params.key) == ("/ca.pem", "/c.pem", "/k.pem")
    for bad, says in [
        ("etcd://h1:2379?cacert=/ca.pem", "need the etcds:// scheme"),
        ("etcds://h1?cert=/c.pem", "cert and key both"),
        ("etcds://h1?tls=1", "unknown option"),
        ("etcd://h1:notaport", "bad port"),
        ("etcd://h1/prefix", "no path"),
        ("etcd://user@h1", "user:password@"),
    ]:
        with pytest.raises(ConfigError, match=says):
            etcd_params(bad)
    with pytest.raises(ConfigError) as info:
        etcd_params("etcd://root:s3cret@h1:1,h2:x")
    assert "s3cret" not in str(info.value) and "root:***@" in str(info.value)


def test_the_epoch_is_the_term_keys_create_revision(etcd_url: str) -> None:
    a = store(etcd_url)
    try:
        term = a.lock.acquire("beat", "a", TTL, 0).term
        assert term is not None and isinstance(a.lock, EtcdLock)
        reply = a.lock.etcd.call(  # the store's own word, not the lock's bookkeeping
            lambda c: c.get("celery_leader/beat/term", metadata=True)
        )
        assert term.epoch == int(reply[0][1]["create_revision"])
    finally:
        a.close()


def test_epochs_stay_above_those_of_a_cluster_that_was_rebuilt(etcd_url: str) -> None:
    """Revisions restart with a new cluster; processes remember higher epochs (min_epoch)."""
    a = store(etcd_url)
    try:
        seen = 10**6  # far above this cluster's revisions
        first = a.lock.acquire("beat", "a", TTL, seen).term
        assert first is not None and first.epoch == seen + 1
        holder = a.lock.holder("beat")
        assert holder is not None and holder.epoch == first.epoch
        a.lock.release("beat", first)
        second = a.lock.acquire("beat", "a", TTL, 0).term
        assert second is not None and second.epoch > first.epoch
        a.lock.release("beat", second)
    finally:
        a.close()


def test_journal_writes_are_one_round_trip_and_one_more_to_drop(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record is a key under its percent-encoded log; a write is one transaction
    while its log is under its cap, one more when keys fall out; a call of more
    writes than a transaction holds, one key among them twice, ends as in memory."""
    made = store(etcd_url)
    journal = made.journal
    assert isinstance(journal, EtcdJournal)
    calls: list[int] = []
    real = journal.etcd.call
    monkeypatch.setattr(journal.etcd, "call", lambda fn: calls.append(1) or real(fn))

    def round_trips(do: Callable[[], object]) -> int:
        calls.clear()
        do()
        return len(calls)

    log = "audit/a b"
    try:
        one = [JournalWrite(log, "000", "first", 3)]
        assert round_trips(lambda: journal.write("jbeat", one)) == 1
        prefix = b"celery_leader/jbeat/journal/audit%2Fa%20b/"
        listed = journal.etcd.kv_range(prefix, wire.prefix_end(prefix), keys_only=True)
        assert [wire.unb64(kv["key"]) for kv in listed["kvs"]] == [prefix + b"000"]
        more = [JournalWrite(log, f"{n:03d}", str(n), 3) for n in range(1, 4)]
        assert round_trips(lambda: journal.write("jbeat", more)) == 2, "a write and a drop"
        assert journal.read("jbeat", log, 10) == [("003", "3"), ("002", "2"), ("001", "1")]
        many = [JournalWrite("audit", f"{n:03d}", str(n), 70) for n in range(100)]
        many.append(JournalWrite("audit", "099", "last", 70))
        journal.write("jbeat", many)
        kept = journal.read("jbeat", "audit", 100)
        assert [k for k, _ in kept] == [f"{n:03d}" for n in range(99, 29, -1)]
        assert kept[0] == ("099", "last"), "the last write of a key is the one kept"
        assert round_trips(lambda: journal.read("jbeat", "audit", 10, before="050")) == 1
    finally:
        made.close()


def test_entry_edits_go_many_to_a_transaction_and_each_keeps_its_own_result(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of adds is a transaction per 63 edits (a bulk add of a million entries
    was a round trip each); a batch with an edit that fails is done again edit by
    edit, its results as one by one; an entry twice, or entries too large for one
    request together, split the batch."""
    made = store(etcd_url)
    entries = made.entries
    assert isinstance(entries, etcd_records.EtcdEntries)
    calls: list[int] = []
    real = entries.etcd.call
    monkeypatch.setattr(entries.etcd, "call", lambda fn: calls.append(1) or real(fn))

    def edits(batch: list[Edit]) -> tuple[list[bool], int]:
        calls.clear()
        return entries.edit("beat", batch), len(calls)

    try:
        adds = [Edit(f"e{i:03}", None, f"v{i}") for i in range(200)]
        assert edits(adds) == ([True] * 200, 4), "200 adds: 63 + 63 + 63 + 11"
        version, stored = entries.load("beat")
        assert stored == {f"e{i:03}": f"v{i}" for i in range(200)}
        mixed = [Edit("e000", "v0", "w0"), Edit("e001", "stale", "w1"), Edit("new", None, "n")]
        assert edits(mixed) == ([True, False, True], 1 + 3)
        assert edits([Edit("e002", "v2", "x"), Edit("e002", "x", "y")]) == ([True, True], 2)
        assert edits([Edit("e003", "stale", None), Edit("e004", "stale", None)])[0] == [
            False,
            False,
        ]
        changed = {"e000": "w0", "new": "n", "e002": "y"}
        assert entries.load("beat")[1] == {**stored, **changed}
        assert entries.changes_since("beat", version) == (entries.version("beat"), changed)
        big = "x" * (etcd_records.EDIT_BYTES // 2)
        assert edits([Edit(f"big{i}", None, big) for i in range(3)]) == ([True] * 3, 2)
        assert len(entries.load("beat")[1]["big2"]) == len(big)
    finally:
        made.close()


@pytest.mark.timing  # within one 0.5 s store deadline
def test_a_dead_member_is_skipped_at_once(etcd_cluster: EtcdCluster, etcd_url: str) -> None:
    """A member that is down costs nothing: the next one is asked at once."""
    # A member that does not lead Raft, so that the others need no election; the
    # URL names it first, so it is the one the store asks.
    leader = etcd_cluster.raft_leader()
    first = next(m for m in etcd_cluster.members if m is not leader)
    others = [m.endpoint for m in etcd_cluster.members if m is not first]
    a = store(f"etcd://{','.join([first.endpoint, *others])}")
    try:
        term = a.lock.acquire("beat", "a", TTL, 0).term
        assert term is not None
        first.kill()
        began = time.monotonic()
        assert a.lock.renew("beat", term, TTL)[0] is Renewal.RENEWED
        assert a.records.claim(Fence("beat", term), [Write("x", None, "1")]) == [True]
        assert time.monotonic() - began < TIMEOUT, "a refused connection is not waited out"
    finally:
        a.close()
        etcd_cluster.start()


@pytest.mark.timing  # within 0.2 s of the store deadline
def test_without_quorum_nobody_can_renew_or_claim(etcd_cluster: EtcdCluster, etcd_url: str) -> None:
    a = store(etcd_url)
    try:
        term = a.lock.acquire("beat", "a", TTL, 0).term
        assert term is not None
        for member in etcd_cluster.members[1:]:
            member.kill()
        began = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            a.lock.renew("beat", term, TTL)
        assert time.monotonic() - began < TIMEOUT + 0.2, "one deadline for the whole renewal"
        assert "\n" not in str(info.value)
        with pytest.raises(StoreUnavailable):
            a.records.claim(Fence("beat", term), [Write("x", None, "1")])
        etcd_cluster.start()
        # The new Raft leader carried the lease over: the term survives the outage.
        assert a.lock.renew("beat", term, TTL)[0] is Renewal.RENEWED
        # A claim that failed may still have been applied (the member queued it until
        # quorum returned): beat counts it as not sent, so a slot is skipped, never doubled.
        assert a.records.claim(Fence("beat", term), [Write("y", None, "1")]) == [True]
    finally:
        a.close()
        etcd_cluster.start()


@pytest.fixture
def secure_cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    """One member behind HTTPS (a self-signed certificate) with users and roles on."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    with EtcdCluster(size=1, tls=(cert, key)) as cluster:
        cluster.enable_auth("rootpw", "leader", "s3cret", "celery_leader/")
        yield cluster


def test_tls_and_a_user_limited_to_the_key_prefix(secure_cluster: EtcdCluster) -> None:
    endpoint = secure_cluster.members[0].endpoint
    ca = secure_cluster.verify
    good = store(f"etcds://leader:s3cret@{endpoint}?cacert={ca}", LOGIN_TIMEOUT)
    wrong = store(f"etcds://leader:wrong@{endpoint}?cacert={ca}", LOGIN_TIMEOUT)
    anonymous = store(f"etcds://{endpoint}?cacert={ca}", LOGIN_TIMEOUT)
    # The system CAs do not know its certificate.
    unverified = store(f"etcds://leader:s3cret@{endpoint}", LOGIN_TIMEOUT)
    try:
        term = good.lock.acquire("beat", "a", TTL, 0).term
        assert term is not None
        assert good.records.claim(Fence("beat", term), [Write("x", None, "1")]) == [True]
        assert good.records.load("beat") == {"x": "1"}
        assert good.lock.renew("beat", term, TTL)[0] is Renewal.RENEWED
        good.lock.release("beat", term)
        assert good.lock.holder("beat") is None

        with pytest.raises(StoreMisconfigured, match="refused user 'leader'") as info:
            wrong.lock.holder("beat")
        assert "wrong" not in str(info.value)
        with pytest.raises(StoreMisconfigured, match="put user:password@"):
            anonymous.lock.holder("beat")
        with pytest.raises(StoreUnavailable, match=r"SSLError|certificate"):
            unverified.lock.holder("beat")
    finally:
        for made in (good, wrong, anonymous, unverified):
            made.close()


def test_a_release_that_failed_without_quorum_is_done_by_the_next_acquire(
    etcd_cluster: EtcdCluster, etcd_url: str
) -> None:
    """Else the new Raft leader would give the orphaned lease a full TTL again."""
    a = store(etcd_url)
    try:
        term = a.lock.acquire("beat", "a", TTL, 0).term
        assert term is not None
        for member in etcd_cluster.members[1:]:
            member.kill()
        with pytest.raises(StoreUnavailable):
            a.lock.release("beat", term)
        etcd_cluster.start()
        again = a.lock.acquire("beat", "a", TTL, 0).term
        assert again is not None and again.epoch > term.epoch
    finally:
        a.close()
        etcd_cluster.start()


def test_pages_of_entries_read_past_a_compaction_go_on_at_the_newest(
    etcd_cluster: EtcdCluster, etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pages are read at the revision of the first; once etcd compacted it away,
    the rest come from the newest, and changes_since from before the compaction says
    to read everything, at once."""
    monkeypatch.setattr(etcd_records, "ENTRIES_PAGE", 3)
    reader, editor = store(etcd_url), store(etcd_url)

    def compact(revision: int) -> None:
        etcd_cluster.post(etcd_cluster.members[0], "kv/compaction", {"revision": str(revision)})

    try:
        written = {f"e{i:02}": str(i) for i in range(10)}
        editor.entries.edit("beat", [Edit(k, None, v) for k, v in written.items()])
        version, pages = reader.entries.load_pages("beat")
        seen = dict(next(pages))
        editor.entries.edit("beat", [Edit("e09", "9", None)])
        newest = reader.entries.version("beat")
        compact(newest)
        for page in pages:
            assert len(page) <= 3
            seen.update(page)
        del written["e09"]
        assert seen == written, "the rest read at the newest revision"
        # The compaction dropped the removal's event (and the watch does not say so).
        assert reader.entries.changes_since("beat", version) is None
        assert editor.entries.edit("beat", [Edit("e00", "0", None)]) == [True]
        assert reader.entries.changes_since("beat", newest) == (
            reader.entries.version("beat"),
            {"e00": None},
        ), "history after the compaction is replayed"
    finally:
        reader.close()
        editor.close()
