"""One contract per facet, every store: memory, file, Redis, PostgreSQL, MariaDB and etcd.

One test class per store facet (:class:`TestLeaseLock`, :class:`TestFencedRecords`,
:class:`TestEntryStore`, :class:`TestRunStore`), each run on every store. Each case
talks to the store through several opened stores (``open_store``), as separate
processes would (separate connections; for ``memory://`` one
process-wide store). What truly differs between stores is said by :class:`Store`
(does a term carry a ttl, can a foreign value be planted, can the store be down)
and tested in the store's own test module.
"""

from __future__ import annotations

import base64
import json
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
import redis
import requests

from celery_leader.backends import (
    Edit,
    EntryStore,
    Fence,
    FencedRecords,
    Journal,
    JournalWrite,
    LeaseLock,
    Renewal,
    RunStore,
    RunSummary,
    RunWrite,
    StoreFacets,
    Term,
    Write,
    open_store,
    sql_facets,
)
from celery_leader.backends import file as file_store
from celery_leader.backends.etcd import records as etcd_records
from celery_leader.backends.redis import entries as redis_entries
from celery_leader.backends.session_lock import SessionStore
from celery_leader.election.history import term_history
from celery_leader.election.lease_set import lease_set
from celery_leader.exceptions import StoreUnavailable
from celery_leader.ledger import RunRecord, marks
from celery_leader.schedule.run_desk import CLAIMS
from celery_leader.schedule.run_request import (
    RunOutcome,
    await_outcome,
    new_request,
    run_slot,
    submit,
)
from celery_leader.settings.config import LeaderConfig
from harness.servers import free_port
from harness.waiting import wait_for

PREFIX = "contract"
#: The module of each store that bounds the edits it tells apart by ``CHANGES_KEPT``.
KEPT_CHANGES = {"redis": redis_entries, "etcd": etcd_records, "file": file_store}
#: The module of each store that reads its entries by pages of ``ENTRIES_PAGE``
#: (Redis too, by HSCAN, but a small hash answers in one page whatever the count).
PAGED_ENTRIES = {"etcd": etcd_records, "file": file_store}
#: Stores that read fenced records by keys, and the module whose ``RECORDS_PAGE``
#: bounds a read of them all (``None``: read in one).
BY_KEYS = {"redis": None, "etcd": etcd_records}
ELECTION = "beat"
TTL = 5.0
TIMEOUT = 0.5


@dataclass
class Store:
    """One store under test: how to open it, and what is particular to it."""

    kind: str
    url: str
    #: A term carries a ttl the store counts down (Redis, memory), rather than
    #: lasting as long as the holder's process or session (file, PostgreSQL).
    expires: bool
    #: Plant a value celery-leader did not write: ``plant(what)`` with ``what`` one of
    #: "term", "epoch", "state"; returns the name the error must carry, or None
    #: when the store cannot hold such a value (typed columns, process memory).
    plant: Callable[[str], str | None]
    #: A URL of this kind where nothing answers; None for a store that cannot be down.
    down_url: str | None
    #: Rewrite the stored term of ELECTION as celery-leader 0.4.0 wrote it (no
    #: ``since``); None for a store whose terms never outlive the process (memory).
    as_written_by_0_4: Callable[[], None] | None = None
    #: Store a slot's run record (key, record) as celery-leader 0.6 did, in the
    #: election's one table of run records, for a minute; None for memory.
    legacy_run: Callable[[str, str], None] | None = None
    #: Have the store read at most n rows a statement (entries by ``load_pages``,
    #: records by ``load``, keys by ``load_some``): ``lower_pages(monkeypatch, n)``
    #: returns the row count of each statement the store runs from then on, or
    #: None when it cannot tell. None: not tried here (a store that reads them at
    #: once; Redis, whose HSCAN page size is a hint, is tried in its own tests).
    lower_pages: Callable[[pytest.MonkeyPatch, int], list[int] | None] | None = None
    #: Have the store remember the latest n entry edits by name (dropping older ones
    #: at each edit): ``keep_changes(monkeypatch, n)``; None where it cannot be lowered.
    keep_changes: Callable[[pytest.MonkeyPatch, int], None] | None = None
    made: list[StoreFacets] = field(default_factory=list)

    def open(self, url: str | None = None) -> StoreFacets:
        """The store as ``open_store`` opens it from settings (store deadline 0.5 s)."""
        config = LeaderConfig.from_mapping(
            {"leader_url": url or self.url, "leader_key_prefix": PREFIX,
             "leader_ttl": 1.5, "leader_renew_interval": TIMEOUT}
        )  # fmt: skip
        opened = open_store(config)
        assert config.store_kind == self.kind and opened.timeout == TIMEOUT
        assert (opened.lock.url, opened.lock.timeout) == (config.url, TIMEOUT)
        self.made.append(opened)
        return opened


def _redis_store(url: str) -> Store:
    client = redis.Redis.from_url(url, decode_responses=True)

    def plant(what: str) -> str:
        name = {"term": "lock", "epoch": "epoch", "state": "state"}[what]
        key = f"{{{PREFIX}:{ELECTION}}}:{name}"
        client.delete(key)
        if what == "epoch":
            client.set(key, "not a number")
        else:
            client.rpush(key, "not ours")  # the wrong type altogether
        return key

    def as_written_by_0_4() -> None:
        key = f"{{{PREFIX}:{ELECTION}}}:lock"
        term = json.loads(client.get(key))
        del term["since"]
        client.set(key, json.dumps(term), keepttl=True)

    def legacy_run(key: str, value: str) -> None:
        client.hset(f"{{{PREFIX}:{ELECTION}}}:runs", key, value)
        (seconds, micros) = client.time()
        expires = seconds * 1000 + micros // 1000 + 60_000
        client.zadd(f"{{{PREFIX}:{ELECTION}}}:runs-expiry", {key: expires})

    def keep_changes(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
        monkeypatch.setattr(redis_entries, "CHANGES_KEPT", n)

    down = f"redis://127.0.0.1:{free_port()}/0"
    return Store(
        "redis", url, True, plant, down, as_written_by_0_4, legacy_run, keep_changes=keep_changes
    )


def _file_store(directory: Path) -> Store:
    def plant(what: str) -> str:
        name = {"term": "holder", "epoch": "epoch", "state": "state"}[what]
        path = directory / f"{PREFIX}.{ELECTION}.{name}"
        path.write_text("{not json" if what != "state" else '{"x": 1}')
        return str(path)

    def as_written_by_0_4() -> None:
        path = directory / f"{PREFIX}.{ELECTION}.holder"
        term = json.loads(path.read_text())
        del term["since"]
        path.write_text(json.dumps(term))

    # Down: the directory is replaced by a file after the store was opened.
    down = f"file://{directory}/down"

    def legacy_run(key: str, value: str) -> None:
        path = directory / f"{PREFIX}.{ELECTION}.runs"
        kept = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**kept, key: [value, time.time() + 60]}))

    url = f"file://{directory}"
    return Store("file", url, False, plant, down, as_written_by_0_4, legacy_run)


def _postgres_store(url: str) -> Store:
    def plant(what: str) -> str | None:
        return None  # typed columns, written only by the holder's own statements

    def as_written_by_0_4() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "UPDATE celery_leader_lease SET token = (token::jsonb - 'since')::text"
                " WHERE prefix = %s AND election = %s",
                (PREFIX, ELECTION),
            )

    def legacy_run(key: str, value: str) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO celery_leader_runs (prefix, election, key, value, expires)"
                " VALUES (%s, %s, %s, %s, extract(epoch FROM now()) + 60)",
                (PREFIX, ELECTION, key, value),
            )

    from celery_leader.backends.postgres.session import Connector

    host, port = "127.0.0.1", free_port()
    down = f"postgresql://leader:pw@{host}:{port}/leader"
    pages = _sql_pages(Connector)
    return Store(
        "postgres", url, False, plant, down, as_written_by_0_4, legacy_run,
        lower_pages=pages, keep_changes=_sql_keep_changes,
    )  # fmt: skip


def _mariadb_store(url: str) -> Store:
    # Imported here, so that collecting the other stores' cases never loads this store.
    from celery_leader.backends.mysql.params import connection_params

    def plant(what: str) -> str | None:
        return None  # typed columns, written only by the holder's own statements

    def as_written_by_0_4() -> None:
        conn = pymysql.connect(**connection_params(url)[0], autocommit=True)
        try:
            with conn.cursor() as cursor:
                cursor.execute(
                    "UPDATE celery_leader_lease SET token = JSON_REMOVE(token, '$.since')"
                    " WHERE prefix = %s AND election = %s",
                    (PREFIX, ELECTION),
                )
        finally:
            conn.close()

    def legacy_run(key: str, value: str) -> None:
        conn = pymysql.connect(**connection_params(url)[0], autocommit=True)
        try:
            with conn.cursor() as cursor:
                cursor.execute(
                    "INSERT INTO celery_leader_runs (prefix, election, run_key, value, expires)"
                    " VALUES (%s, %s, %s, %s, UNIX_TIMESTAMP(NOW(6)) + 60)",
                    (PREFIX, ELECTION, key, value),
                )
        finally:
            conn.close()

    from celery_leader.backends.mysql.session import Connector

    down = f"mariadb://leader:pw@127.0.0.1:{free_port()}/leader"
    pages = _sql_pages(Connector)
    return Store(
        "mysql", url, False, plant, down, as_written_by_0_4, legacy_run,
        lower_pages=pages, keep_changes=_sql_keep_changes,
    )  # fmt: skip


def _sql_keep_changes(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    monkeypatch.setattr(sql_facets, "CHANGES_KEPT", n)
    monkeypatch.setattr(sql_facets, "DROP_EVERY", 1)


def _sql_pages(
    connector: type[SessionStore[Any]],
) -> Callable[[pytest.MonkeyPatch, int], list[int]]:
    """A SQL store's ``lower_pages``: its page sizes, and a count of every statement's rows."""

    def lower_pages(monkeypatch: pytest.MonkeyPatch, n: int) -> list[int]:
        for name in ("ENTRIES_PAGE", "STATE_PAGE", "STATE_KEYS"):
            monkeypatch.setattr(sql_facets, name, n)
        counts: list[int] = []
        execute = connector.execute

        def counted(self: Any, session: Any, query: str, params: Any = None) -> Any:
            rows = execute(self, session, query, params)
            counts.append(len(rows))
            return rows

        monkeypatch.setattr(connector, "execute", counted)
        return counts

    return lower_pages


def _etcd_store(url: str) -> Store:
    endpoint = url.removeprefix("etcd://").split(",")[0]

    def plant(what: str) -> str | None:
        if what == "state":
            return None  # one key per entry, each returned as stored: no container to spoil
        name = {"term": "term", "epoch": "epoch-offset"}[what]
        key = f"{PREFIX}/{ELECTION}/{name}"
        value = "not ours" if what == "term" else "not a number"
        encoded = {"key": _b64(key), "value": _b64(value)}
        requests.post(f"http://{endpoint}/v3/kv/put", json=encoded, timeout=5).raise_for_status()
        return key

    def as_written_by_0_4() -> None:
        key = _b64(f"{PREFIX}/{ELECTION}/term")
        found = requests.post(f"http://{endpoint}/v3/kv/range", json={"key": key}, timeout=5)
        (kv,) = found.json()["kvs"]
        term = json.loads(base64.b64decode(kv["value"]))
        del term["since"]
        # Rewritten on the term's own lease: its create revision (the epoch) stays.
        put = {"key": key, "value": _b64(json.dumps(term)), "lease": kv["lease"]}
        requests.post(f"http://{endpoint}/v3/kv/put", json=put, timeout=5).raise_for_status()

    def legacy_run(key: str, value: str) -> None:
        grant = requests.post(f"http://{endpoint}/v3/lease/grant", json={"TTL": 60}, timeout=5)
        lease = grant.json()["ID"]
        put = {"key": _b64(f"{PREFIX}/{ELECTION}/runs/{key}"), "value": _b64(value), "lease": lease}
        requests.post(f"http://{endpoint}/v3/kv/put", json=put, timeout=5).raise_for_status()

    down = f"etcd://127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    return Store("etcd", url, True, plant, down, as_written_by_0_4, legacy_run)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _memory_store() -> Store:
    return Store("memory", f"memory://contract-{uuid.uuid4().hex}", True, lambda what: None, None)


@pytest.fixture(
    params=[
        "memory",
        "file",
        "redis",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
        "etcd",
    ]
)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    kind = request.param
    if kind == "memory":
        made = _memory_store()
    elif kind == "file":
        made = _file_store(tmp_path / "leases")
    elif kind == "redis":
        made = _redis_store(request.getfixturevalue("redis_url"))
    elif kind == "etcd":
        made = _etcd_store(request.getfixturevalue("etcd_url"))
    elif kind == "mariadb":
        made = _mariadb_store(request.getfixturevalue("mariadb_url"))
    else:
        made = _postgres_store(request.getfixturevalue("postgres_url"))
    yield made
    for opened in made.made:
        opened.close()


def take(opened: StoreFacets, instance_id: str, min_epoch: int = 0) -> Term:
    result = opened.lock.acquire(ELECTION, instance_id, TTL, min_epoch)
    assert result.term is not None, result
    return result.term


class Follower:
    """A follower's loop as the lease runs it: acquire, else wait; until it holds a term."""

    def __init__(self, lock: LeaseLock) -> None:
        self.lock = lock
        self.cancel = threading.Event()
        self.waits = 0  # waits entered
        self.term: Term | None = None
        self.took_at = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self.cancel.is_set():
            result = self.lock.acquire(ELECTION, "b", TTL, 0)
            if result.term is not None:
                self.term, self.took_at = result.term, time.monotonic()
                return
            self.waits += 1
            self.lock.wait(ELECTION, result.retry_after, self.cancel)

    def stop(self) -> None:
        self.cancel.set()
        self._thread.join(5)


#: A term no store handed out, for calls to a store that is down.
FAKE = Term(json.dumps({"token": "t", "epoch": 1, "holder": "x"}), 1)


def _down(store: Store) -> StoreFacets:
    """A store of ``store``'s kind where nothing answers (skips stores that cannot be down)."""
    if store.down_url is None:
        pytest.skip(f"{store.kind} lives in this process and cannot be down")
    opened = store.open(store.down_url)  # opening it does not contact the store
    if store.kind == "file":
        shutil.rmtree(Path(store.down_url.removeprefix("file://")))
        Path(store.down_url.removeprefix("file://")).write_text("a file, not a directory")
    return opened


def _only_store_unavailable(*calls: Callable[[], object]) -> None:
    for call in calls:
        try:
            call()
        except StoreUnavailable:
            pass  # the only error a store call may raise


class TestLeaseLock:
    """The lease-lock facet (:class:`~celery_leader.backends.LeaseLock`): terms, holders, waits."""

    def test_every_store_has_a_lease_lock(self, store: Store) -> None:
        assert isinstance(store.open().lock, LeaseLock)

    def test_acquire_and_renew_carry_the_store_clock(self, store: Store) -> None:
        """Stores with a clock answer acquire, renew and the probe with it (the servers
        here run on this host's clock); the others say they have none."""
        a, b = store.open(), store.open()
        won = a.lock.acquire(ELECTION, "a", TTL, 0)
        lost = b.lock.acquire(ELECTION, "b", TTL, 0)
        assert won.term is not None
        renewal, renewed_at = a.lock.renew(ELECTION, won.term, TTL)
        assert renewal is Renewal.RENEWED
        times = [won.store_time, lost.store_time, renewed_at, b.lock.store_time(ELECTION)]
        resolution = a.lock.clock_resolution
        if resolution is None:
            assert times == [None] * 4
        else:
            # Truncated to the resolution, read within a second of now on this host.
            for when in times:
                assert when is not None
                assert abs(when + resolution / 2 - time.time()) < 1.0 + resolution
        b.lock.release(ELECTION, None)
        a.lock.release(ELECTION, won.term)

    def test_acquire_renew_release(self, store: Store) -> None:
        a, b, observer = store.open(), store.open(), store.open()
        assert observer.lock.holder(ELECTION) is None

        term = take(a, "a")
        stored = json.loads(term.token)
        assert stored["holder"] == "a" and stored["epoch"] == term.epoch > 0 and stored["token"]

        lost = b.lock.acquire(ELECTION, "b", TTL, 0)
        assert lost.term is None
        assert lost.holder is not None and (lost.holder.instance_id, lost.holder.epoch) == (
            "a",
            term.epoch,
        )
        assert 0 < lost.retry_after <= TTL

        holder = observer.lock.holder(ELECTION)
        assert holder is not None and (holder.instance_id, holder.epoch) == ("a", term.epoch)
        if store.expires:
            assert holder.ttl_remaining is not None and 0 < holder.ttl_remaining <= TTL
        else:
            assert holder.ttl_remaining is None  # held as long as the holder lives

        assert a.lock.renew(ELECTION, term, TTL)[0] is Renewal.RENEWED
        # A PostgreSQL follower stays queued for the lock until it leaves.
        b.lock.release(ELECTION, None)
        a.lock.release(ELECTION, term)
        assert observer.lock.holder(ELECTION) is None

        second = take(b, "b")
        assert second.epoch > term.epoch
        assert ELECTION in observer.lock.holders()
        known = observer.lock.holders([ELECTION, "nobody-here"])
        assert known.keys() == {ELECTION, "nobody-here"} and known["nobody-here"] is None
        found = known[ELECTION]
        assert found is not None and found.epoch == second.epoch

    def test_holders_say_since_when_their_term_began(self, store: Store) -> None:
        a, b, observer = store.open(), store.open(), store.open()
        before = time.time()
        term = take(a, "a")
        after = time.time()
        holder = observer.lock.holder(ELECTION)
        assert holder is not None and holder.since is not None
        # On the store's clock (this host's, in these tests), to its resolution:
        # etcd's is the whole second of an HTTP Date header.
        assert before - 1.0 <= holder.since <= after + 0.01
        assert term.since == holder.since, "the winner knows its term's start as others read it"
        lost = b.lock.acquire(ELECTION, "b", TTL, 0)
        assert lost.holder is not None and lost.holder.since == holder.since
        asked = observer.lock.request_resign(ELECTION)
        assert asked is not None and asked.since == holder.since
        assert a.lock.renew(ELECTION, term, TTL)[0] is Renewal.RESIGN
        still = observer.lock.holder(ELECTION)
        assert still is not None and still.since == holder.since, "renewals keep the start"
        b.lock.release(ELECTION, None)
        a.lock.release(ELECTION, term)
        time.sleep(0.01)  # the next term starts at a later time, even on a coarse clock
        second = take(b, "b")
        again = observer.lock.holder(ELECTION)
        assert again is not None and again.epoch == second.epoch
        assert again.since is not None and again.since >= holder.since

    def test_a_term_written_by_0_4_reads_with_since_unknown(self, store: Store) -> None:
        if store.as_written_by_0_4 is None:
            pytest.skip(f"{store.kind} keeps no term past its process")
        a, b, observer = store.open(), store.open(), store.open()
        term = take(a, "a")
        store.as_written_by_0_4()
        holder = observer.lock.holder(ELECTION)
        assert holder is not None and (holder.instance_id, holder.epoch) == ("a", term.epoch)
        assert holder.since is None
        lost = b.lock.acquire(ELECTION, "b", TTL, 0)
        assert lost.holder is not None and lost.holder.since is None
        assert lost.holder.epoch == term.epoch
        b.lock.release(ELECTION, None)

    def test_epochs_grow_past_the_highest_one_seen(self, store: Store) -> None:
        a = store.open()
        first = take(a, "a", min_epoch=41)
        assert first.epoch >= 42
        a.lock.release(ELECTION, first)
        assert take(a, "a").epoch > first.epoch

    def test_resign_reaches_the_holder_at_its_next_renewal(self, store: Store) -> None:
        a, observer = store.open(), store.open()
        assert observer.lock.request_resign(ELECTION) is None, "nobody to ask"
        term = take(a, "a")
        asked = observer.lock.request_resign(ELECTION)
        assert asked is not None and (asked.instance_id, asked.epoch) == ("a", term.epoch)
        assert a.lock.renew(ELECTION, term, TTL)[0] is Renewal.RESIGN

    @pytest.mark.timing  # a release wakes the follower within 0.5 s
    def test_a_waiting_follower_wakes_promptly_on_release(self, store: Store) -> None:
        a = store.open()
        term = take(a, "a")
        follower = Follower(store.open().lock)
        try:
            # Settled in its wait (a Redis follower's first wait only subscribes).
            wait_for(lambda: follower.waits >= 1, 5, message="the follower never waited")
            time.sleep(0.3)
            assert follower.term is None, "took a held election"
            released = time.monotonic()
            a.lock.release(ELECTION, term)
            wait_for(lambda: follower.term is not None, 2, message="the follower never woke")
            took = follower.took_at - released
            print(f"\nCONTRACT {store.kind}: follower took over {took * 1000:.1f} ms after release")
            assert took < 0.5
            assert follower.term is not None and follower.term.epoch > term.epoch
        finally:
            follower.stop()

    @pytest.mark.timing  # a cancel ends a wait within 0.1 s
    def test_wait_ends_at_its_timeout_or_at_cancel(self, store: Store) -> None:
        a, b = store.open(), store.open()
        take(a, "a")
        assert b.lock.acquire(ELECTION, "b", TTL, 0).term is None
        b.lock.wait(ELECTION, 0.1, threading.Event())  # first wait may only set up (subscribe)
        began = time.monotonic()
        b.lock.wait(ELECTION, 0.3, threading.Event())
        waited = time.monotonic() - began
        assert 0.25 <= waited < 0.8, waited

        cancel = threading.Event()
        set_at: list[float] = []

        def fire() -> None:
            set_at.append(time.monotonic())
            cancel.set()

        threading.Timer(0.2, fire).start()
        b.lock.wait(ELECTION, 10.0, cancel)
        assert time.monotonic() - set_at[0] < 0.1, "a stopping lease is not held up"

    def test_a_foreign_term_is_never_taken_and_names_where_it_is(self, store: Store) -> None:
        a, b = store.open(), store.open()
        held = take(a, "a")  # the file store keeps its term record beside a held lock
        where = store.plant("term")
        if where is None:
            pytest.skip(f"{store.kind} keeps no term it did not write")
        with pytest.raises(StoreUnavailable, match="not a celery-leader term") as info:
            b.lock.acquire(ELECTION, "b", TTL, 0)
        assert where in str(info.value) and "\n" not in str(info.value)
        with pytest.raises(StoreUnavailable, match="not a celery-leader term"):
            b.lock.holder(ELECTION)
        if store.kind == "file":  # the flock, not the record, is the lock: still ours
            assert a.lock.renew(ELECTION, held, TTL)[0] is Renewal.RENEWED

    def test_a_foreign_epoch_counter_is_never_restarted(self, store: Store) -> None:
        a = store.open()
        where = store.plant("epoch")
        if where is None:
            pytest.skip(f"{store.kind} keeps its epoch in a typed column or in memory")
        with pytest.raises(StoreUnavailable, match="not an epoch counter") as info:
            a.lock.acquire(ELECTION, "a", TTL, 0)
        assert where in str(info.value) and "\n" not in str(info.value)

    @pytest.mark.timing  # one store deadline plus 0.4 s
    def test_a_store_that_is_down_raises_store_unavailable_only(self, store: Store) -> None:
        down = _down(store)
        with pytest.raises(StoreUnavailable) as info:
            down.lock.acquire(ELECTION, "a", TTL, 0)
        assert "\n" not in str(info.value)
        _only_store_unavailable(
            lambda: down.lock.renew(ELECTION, FAKE, TTL),
            lambda: down.lock.release(ELECTION, FAKE),
            lambda: down.lock.holder(ELECTION),
            lambda: down.lock.request_resign(ELECTION),
            lambda: down.lock.holders(),
        )
        began = time.monotonic()
        down.lock.wait(ELECTION, 0.2, threading.Event())  # never raises; waits its time at most
        assert time.monotonic() - began < 0.2 + TIMEOUT + 0.2


class TestFencedRecords:
    """The fenced-records facet (:class:`~celery_leader.backends.FencedRecords`), under
    fences of terms the lease lock hands out."""

    def test_every_store_has_fenced_records(self, store: Store) -> None:
        assert isinstance(store.open().records, FencedRecords)

    def test_a_lost_term_is_over_for_good(self, store: Store) -> None:
        a, b = store.open(), store.open()
        old = take(a, "a")
        assert a.records.claim(Fence(ELECTION, old), [Write("x", None, '"old"')]) == [True]
        a.lock.release(ELECTION, old)
        new = take(b, "b")

        assert a.lock.renew(ELECTION, old, TTL)[0] is Renewal.LOST
        assert a.records.claim(
            Fence(ELECTION, old), [Write("x", '"old"', '"stale"'), Write("y", None, "1")]
        ) == [
            False,
            False,
        ], "a stale term fails every claim"
        a.lock.release(ELECTION, old)  # harmless: it never frees the new term
        holder = b.lock.holder(ELECTION)
        assert holder is not None and holder.epoch == new.epoch
        assert b.lock.renew(ELECTION, new, TTL)[0] is Renewal.RENEWED
        assert b.records.load(ELECTION) == {"x": '"old"'}

    def test_claims_are_fenced_compare_and_sets_in_order(self, store: Store) -> None:
        a, observer = store.open(), store.open()
        term = take(a, "a")
        claims = [
            Write("x", None, '"1"'),  # nothing stored: taken
            Write("x", None, '"2"'),  # now stored: fails
            Write("y", '"0"', '"1"'),  # expects a value that is not there: fails
            Write("x", '"1"', '"3"'),  # matches the first claim's value: taken
            Write("z", None, '"1"'),
        ]
        assert a.records.claim(Fence(ELECTION, term), claims) == [True, False, False, True, True]
        assert observer.records.load(ELECTION) == {"x": '"3"', "z": '"1"'}
        assert a.records.claim(Fence(ELECTION, term), [Write("z", '"9"', '"2"')]) == [False]
        assert a.records.claim(Fence(ELECTION, term), []) == []
        many = [Write(f"e{i}", None, str(i)) for i in range(1200)]  # more than one Redis chunk
        assert a.records.claim(Fence(ELECTION, term), many) == [True] * 1200
        assert len(observer.records.load(ELECTION)) == 1202
        assert observer.records.load("other") == {}

    def test_the_state_of_some_keys_is_what_the_whole_state_says_of_them(
        self, store: Store
    ) -> None:
        a, observer = store.open(), store.open()
        term = take(a, "a")
        assert a.records.claim(
            Fence(ELECTION, term), [Write("x", None, '"1"'), Write("y", None, '"2"')]
        )
        some = observer.records.load_some(ELECTION, ["x", "absent"])
        assert some is None or some == {"x": '"1"'}  # None: this store reads all at once
        assert observer.records.load_some(ELECTION, []) in (None, {})

    def test_records_are_read_in_bounded_statements_whatever_their_number(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``load`` reads the records page by page and ``load_some`` the keys asked
        chunk by chunk (where the store reads by pages), and both read them all."""
        if store.lower_pages is None:
            pytest.skip(f"{store.kind} reads its records at once")
        a, observer = store.open(), store.open()
        term = take(a, "a")
        claimed = {f"r{i:03}": f'"{i}"' for i in range(250)}
        writes = [Write(k, None, v) for k, v in claimed.items()]
        assert a.records.claim(Fence(ELECTION, term), writes) == [True] * 250
        counts = store.lower_pages(monkeypatch, 100)

        assert observer.records.load(ELECTION) == claimed
        assert a.records.load(ELECTION) == claimed, "the holder too"
        if counts is not None:
            assert counts and max(counts) <= 100, counts
        keys = [*claimed, "absent", "r000"]
        assert observer.records.load_some(ELECTION, keys) == claimed
        assert a.records.load_some(ELECTION, keys) == claimed
        if counts is not None:
            assert max(counts) <= 100, counts

    def test_records_are_read_by_keys_and_all_of_them_by_bounded_reads(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        if store.kind not in BY_KEYS:
            pytest.skip(f"{store.kind} reads its records at once")
        paged = BY_KEYS[store.kind]
        if paged is not None:
            monkeypatch.setattr(paged, "RECORDS_PAGE", 7)
        a, observer = store.open(), store.open()
        term = take(a, "a")
        written = {f"r{i:03}": f'"{i}"' for i in range(150)}  # more than a transaction reads
        claims = [Write(k, None, v) for k, v in written.items()]
        assert a.records.claim(Fence(ELECTION, term), claims) == [True] * 150
        assert observer.records.load(ELECTION) == written
        keys = [*written, "absent", "r1"]
        assert observer.records.load_some(ELECTION, keys) == written

    def test_a_write_must_come_after_the_record_it_replaces(self, store: Store) -> None:
        """Order keys are compared as strings, never parsed: a record only moves forward."""
        a, observer = store.open(), store.open()
        term = take(a, "a")
        assert a.records.claim(Fence(ELECTION, term), [Write("x", None, "r1", order="0005")]) == [
            True
        ]

        def step(order: str, new: str = "r2") -> Write:
            return Write("x", "r1", new, order=order, after="0005")

        for order in ("0005", "0004", "0000"):
            assert a.records.claim(Fence(ELECTION, term), [step(order)]) == [False], order
            assert observer.records.load(ELECTION) == {"x": "r1"}
        assert a.records.claim(Fence(ELECTION, term), [step("0006"), step("0007", "r3")]) == [
            True,
            False,  # the first write of the batch changed the stored record
        ]
        assert observer.records.load(ELECTION) == {"x": "r2"}

    def test_foreign_schedule_state_reads_as_empty_and_the_next_claim_replaces_it(
        self, store: Store, caplog: pytest.LogCaptureFixture
    ) -> None:
        a = store.open()
        term = take(a, "a")
        where = store.plant("state")
        if where is None:
            pytest.skip(f"{store.kind} keeps its state in typed rows or in process memory")
        assert a.records.load(ELECTION) == {}
        assert where in caplog.text, "logged, naming where"
        assert a.records.claim(Fence(ELECTION, term), [Write("x", None, '"mine"')]) == [True]
        assert a.records.load(ELECTION) == {"x": '"mine"'}

    def test_a_store_that_is_down_raises_store_unavailable_only(self, store: Store) -> None:
        down = _down(store)
        _only_store_unavailable(
            lambda: down.records.load(ELECTION),
            lambda: down.records.claim(Fence(ELECTION, FAKE), [Write("x", None, "1")]),
        )


class TestEntryStore:
    """The entries facet (:class:`~celery_leader.backends.EntryStore`): schedule entries
    anyone may edit, versioned."""

    def test_every_store_has_an_entry_store(self, store: Store) -> None:
        assert isinstance(store.open().entries, EntryStore)

    def test_one_entry_is_read_by_its_name(self, store: Store) -> None:
        reader, editor = store.open(), store.open()
        names = ["a", "b/c d:\u00e9", "a0"]  # separators, spaces, non-ASCII; a prefix of another
        edits = [Edit(n, None, f'{{"v": "{i}"}}') for i, n in enumerate(names)]
        assert editor.entries.edit(ELECTION, edits) == [True] * 3
        assert [reader.entries.load_one(ELECTION, n) for n in names] == [e.new for e in edits]
        assert reader.entries.load_one(ELECTION, "absent") is None
        assert reader.entries.load_one("other", "a") is None, "elections are apart"
        later = [Edit("a", edits[0].new, "x"), Edit("a0", edits[2].new, None)]
        assert editor.entries.edit(ELECTION, later) == [True, True]
        assert reader.entries.load_one(ELECTION, "a") == "x"
        assert reader.entries.load_one(ELECTION, "a0") is None, "removed"

    def test_entries_are_edited_by_anyone_with_compare_and_set(self, store: Store) -> None:
        """Schedule entries need no term; every applied edit moves the version."""
        leader, editor, other = store.open(), store.open(), store.open()
        take(leader, "a")
        assert editor.entries.load(ELECTION) == (0, {})
        assert editor.entries.version(ELECTION) == 0
        edits = [
            Edit("x", None, '{"v":1}'),  # nothing stored: created
            Edit("x", None, '{"v":2}'),  # now stored: fails
            Edit("y", '{"v":0}', '{"v":1}'),  # expects what is not there: fails
            Edit("x", '{"v":1}', '{"v":3}'),  # matches: replaced
            Edit("z", None, "z1"),
        ]
        assert other.entries.edit(ELECTION, edits) == [True, False, False, True, True]
        version, entries = leader.entries.load(ELECTION)
        assert entries == {"x": '{"v":3}', "z": "z1"}
        assert version > 0 and leader.entries.version(ELECTION) == version

        assert editor.entries.edit(ELECTION, [Edit("z", "stale", None)]) == [False]
        assert leader.entries.version(ELECTION) == version, "nothing applied, nothing moved"
        assert editor.entries.edit(ELECTION, [Edit("z", "z1", None)]) == [True]
        moved, entries = leader.entries.load(ELECTION)
        assert entries == {"x": '{"v":3}'} and moved > version
        assert leader.records.load(ELECTION) == {}, "entries are apart from the run state"
        assert leader.entries.load("other") == (0, {})

    def test_a_run_request_waits_among_the_entries_for_its_answer(self, store: Store) -> None:
        """Run now: a request any process writes (no term), claimed in the fenced
        records under the leader's term, answered in place, read by its requester."""
        requester, leader = store.open(), store.open()
        term = take(leader, "a")
        since = requester.entries.version(ELECTION)
        asked = new_request("a-very-long-name." * 11, "key", "me", "why", time.time())
        request, repeated = submit(requester.entries, ELECTION, asked)
        assert not repeated
        slot = run_slot(request.entry, datetime.now(timezone.utc))
        answer = RunOutcome("sent", time.time(), slot, term.epoch)
        claims = json.dumps({request.store_key: {"slot": answer.slot, "epoch": term.epoch}})
        fence = Fence(ELECTION, term)
        assert leader.records.claim(fence, [Write(CLAIMS, None, claims)]) == [True]
        text = leader.entries.load(ELECTION)[1][request.store_key]
        edit = Edit(request.store_key, text, request.answered(answer).dump())

        def answers() -> None:
            time.sleep(0.2)
            assert leader.entries.edit(ELECTION, [edit]) == [True]

        thread = threading.Thread(target=answers)
        thread.start()
        found = await_outcome(requester.entries, ELECTION, request, since, 10)
        thread.join()
        assert found.outcome == answer
        assert submit(requester.entries, ELECTION, asked) == (found, True)
        assert leader.records.load_some(ELECTION, [CLAIMS]) in (None, {CLAIMS: claims})

    def test_a_reader_is_told_only_the_entries_edited_since_its_version(self, store: Store) -> None:
        reader, editor = store.open(), store.open()
        editor.entries.edit(ELECTION, [Edit("a", None, "a1"), Edit("b", None, "b1")])
        version, _ = reader.entries.load(ELECTION)
        assert reader.entries.changes_since(ELECTION, version) == (version, {})
        editor.entries.edit(ELECTION, [Edit("a", "a1", "a2"), Edit("c", None, "c1")])
        editor.entries.edit(ELECTION, [Edit("b", "b1", None), Edit("x", "not there", "x")])
        moved = reader.entries.version(ELECTION)
        assert reader.entries.changes_since(ELECTION, version) == (
            moved,
            {"a": "a2", "c": "c1", "b": None},
        ), "the failed edit of x is not a change"
        assert reader.entries.changes_since(ELECTION, moved) == (moved, {})
        assert reader.entries.changes_since(ELECTION, moved + 5) is None, "a store behind"

    def test_load_pages_reads_every_entry_by_pages_after_the_version(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Pages come as the reader asks; an edit made meanwhile is in the pages or in
        the changes since the version read first, never lost."""
        reader, editor = store.open(), store.open()
        truth = {f"e{i:03}": f"v{i}" for i in range(250)}
        assert (
            editor.entries.edit(ELECTION, [Edit(k, None, v) for k, v in truth.items()])
            == [True] * 250
        )
        counts = None if store.lower_pages is None else store.lower_pages(monkeypatch, 100)
        version, pages = reader.entries.load_pages(ELECTION)
        assert version == reader.entries.version(ELECTION)
        view = dict(next(pages))
        edits = [Edit("e000", "v0", "moved"), Edit("e249", "v249", None), Edit("zz", None, "new")]
        assert editor.entries.edit(ELECTION, edits) == [True, True, True]
        truth.update(e000="moved", zz="new")
        del truth["e249"]
        read = 1
        for page in pages:
            view.update(page)
            read += 1
        changed = reader.entries.changes_since(ELECTION, version)
        if changed is None:
            pytest.fail("a store that reads by pages must say what changed meanwhile")
        for name, value in changed[1].items():
            view.pop(name, None)
            if value is not None:
                view[name] = value
        assert view == truth
        assert reader.entries.load(ELECTION) == (changed[0], truth)
        if store.lower_pages is not None:
            assert read > 1, "several pages"
        if counts is not None:
            assert counts and max(counts) <= 100, counts

    def test_the_changes_kept_are_bounded_and_a_reader_further_behind_reads_everything(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        if store.keep_changes is None:
            pytest.skip(f"{store.kind} keeps its changes its own way (see its tests)")
        store.keep_changes(monkeypatch, 3)
        reader, editor = store.open(), store.open()
        versions = []
        for i in range(5):
            assert editor.entries.edit(ELECTION, [Edit(f"e{i}", None, str(i))]) == [True]
            versions.append(reader.entries.version(ELECTION))
        assert editor.entries.edit(ELECTION, [Edit("e2", "2", None)]) == [True]
        latest = reader.entries.version(ELECTION)
        assert reader.entries.changes_since(ELECTION, versions[2]) == (
            latest,
            {"e3": "3", "e4": "4", "e2": None},
        ), "the latest 3 names, a removal among them"
        assert reader.entries.changes_since(ELECTION, versions[0]) is None, "e1 was forgotten"
        assert reader.entries.load(ELECTION) == (
            latest,
            {"e0": "0", "e1": "1", "e3": "3", "e4": "4"},
        )

    def test_a_reader_too_far_behind_is_told_to_read_every_entry(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        if store.kind not in KEPT_CHANGES:
            pytest.skip(f"{store.kind} keeps no bound of its own")
        monkeypatch.setattr(KEPT_CHANGES[store.kind], "CHANGES_KEPT", 3)
        reader, editor = store.open(), store.open()
        editor.entries.edit(ELECTION, [Edit("a", None, "a1")])
        version = reader.entries.version(ELECTION)
        editor.entries.edit(ELECTION, [Edit("a", "a1", None), Edit("b", None, "b1")])
        moved = reader.entries.version(ELECTION)
        assert reader.entries.changes_since(ELECTION, version) == (moved, {"a": None, "b": "b1"})
        editor.entries.edit(ELECTION, [Edit(k, None, k) for k in "cdef"])
        assert reader.entries.changes_since(ELECTION, version) is None

    def test_entries_are_read_by_bounded_pages_at_the_version_read_first(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        if store.kind not in PAGED_ENTRIES:
            pytest.skip(f"{store.kind} reads its entries at once")
        monkeypatch.setattr(PAGED_ENTRIES[store.kind], "ENTRIES_PAGE", 3)
        reader, editor = store.open(), store.open()
        assert [*reader.entries.load_pages(ELECTION)[1]] in ([], [{}])
        written = {f"e{i:02}": f'{{"v": "{i}\\"\u00e9"}}' for i in range(20)}  # escapes too
        editor.entries.edit(ELECTION, [Edit(k, None, v) for k, v in written.items()])
        version, pages = reader.entries.load_pages(ELECTION)
        assert version == reader.entries.version(ELECTION)
        first = next(pages)
        assert 0 < len(first) <= 3
        # An edit between pages: changes_since tells it.
        editor.entries.edit(ELECTION, [Edit("e19", written["e19"], None)])
        rest = [*pages]
        assert len(rest) >= 5 and all(len(page) <= 3 for page in rest)
        seen: dict[str, str] = {}
        for page in [first, *rest]:
            seen.update(page)
        assert seen == written, "one view of the entries, at the version read first"
        assert reader.entries.changes_since(ELECTION, version) == (
            reader.entries.version(ELECTION),
            {"e19": None},
        )
        assert reader.entries.load(ELECTION)[1] == {k: v for k, v in written.items() if k != "e19"}

    def test_a_reader_following_racing_edits_ends_with_what_the_store_holds(
        self, store: Store
    ) -> None:
        """Reads by change and by page race a stream of edits: none is ever missed."""
        reader, editor = store.open(), store.open()
        truth = {f"e{i}": "0" for i in range(20)}
        editor.entries.edit(ELECTION, [Edit(k, None, v) for k, v in truth.items()])
        version, view = reader.entries.load(ELECTION)
        done = threading.Event()

        def edit() -> None:
            for n in range(300):
                name = f"e{n % 25}"
                old = truth.get(name)
                new = None if old is not None and n % 3 == 0 else str(n)
                assert editor.entries.edit(ELECTION, [Edit(name, old, new)]) == [True]
                if new is None:
                    del truth[name]
                else:
                    truth[name] = new
            done.set()

        def follow() -> None:
            nonlocal version, view
            changed = reader.entries.changes_since(ELECTION, version)
            if changed is None:
                version, view = reader.entries.load(ELECTION)
                return
            version, edits = changed
            for name, value in edits.items():
                view.pop(name, None)
                if value is not None:
                    view[name] = value

        thread = threading.Thread(target=edit)
        thread.start()
        while not done.is_set():
            follow()
        thread.join()
        while reader.entries.version(ELECTION) != version:
            follow()
        assert view == truth

    def test_concurrent_entry_editors_never_both_win(self, store: Store) -> None:
        editors = [store.open() for _ in range(4)]
        editors[0].entries.edit(ELECTION, [Edit("x", None, "0")])
        wins: list[str] = []

        def edit(i: int) -> None:
            if editors[i].entries.edit(ELECTION, [Edit("x", "0", f"by {i}")]) == [True]:
                wins.append(f"by {i}")

        threads = [threading.Thread(target=edit, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(wins) == 1
        assert editors[1].entries.load(ELECTION)[1] == {"x": wins[0]}


def runs(opened: StoreFacets, entry: str, election: str = ELECTION) -> dict[str, str]:
    """Every run record of ``entry`` a store keeps (tests keep few)."""
    return dict(opened.runs.runs_of(election, entry, 1000))


def summaries(opened: StoreFacets) -> dict[str, RunSummary]:
    return {s.entry: s for s in opened.runs.summaries(ELECTION)}


class TestRunStore:
    """The run-records facet (:class:`~celery_leader.backends.RunStore`, the run ledger):
    unfenced compare-and-sets that expire."""

    def test_every_store_has_a_run_store(self, store: Store) -> None:
        assert isinstance(store.open().runs, RunStore)

    def test_set_if_absent_needs_no_term_and_says_what_is_stored(self, store: Store) -> None:
        a, b = store.open(), store.open()
        assert a.runs.put(ELECTION, RunWrite("job@1", None, "started-a", 60)) == (True, "started-a")
        assert b.runs.put(ELECTION, RunWrite("job@1", None, "started-b", 60)) == (
            False,
            "started-a",
        )
        assert b.runs.put(ELECTION, RunWrite("job@1", "other", "x", 60)) == (False, "started-a")
        assert b.runs.put(ELECTION, RunWrite("job@1", "started-a", "done-a", 60)) == (
            True,
            "done-a",
        )
        assert b.runs.put(ELECTION, RunWrite("job@2", "started-a", "x", 60))[0] is False, (
            "nothing there"
        )
        assert runs(a, "job") == {"job@1": "done-a"}
        assert runs(a, "job", "other") == {}
        assert a.records.load(ELECTION) == {}, "run records live apart from the schedule state"

    def test_the_ledgers_marks_are_read_without_a_write(self, store: Store) -> None:
        """How beat reads a slot's record and the ``@ledger-workers`` mark: one compare-and-set
        that cannot succeed (PostgreSQL once refused its expected value, so beat never re-sent)."""
        a = store.open()
        assert marks.read(a.runs, ELECTION, "job@1", 60) is None
        assert marks.mark_sent(a.runs, ELECTION, "job@1", "beat-a", 60, 0)
        sent = marks.read(a.runs, ELECTION, "job@1", 60)
        assert sent is not None and RunRecord.load(sent, "job@1") is not None
        assert marks.touch(a.runs, ELECTION, "@mark", {"since": 1}, 60) == '{"since": 1}'
        assert marks.touch(a.runs, ELECTION, "@mark", {"since": 2}, 60) == '{"since": 1}'
        assert marks.read(a.runs, ELECTION, "@mark", 60) == '{"since": 1}'
        assert runs(a, "job") == {"job@1": sent}
        assert list(summaries(a)) == ["job"], "a mark is no entry's record"

    def test_one_of_many_racing_writers_wins(self, store: Store) -> None:
        opened = [store.open() for _ in range(4)]
        won: list[str] = []

        def race(i: int) -> None:
            ok, _ = opened[i].runs.put(ELECTION, RunWrite("job@race", None, f"w{i}", 60, tally="t"))
            if ok:
                won.append(f"w{i}")

        threads = [threading.Thread(target=race, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(won) == 1
        assert runs(opened[0], "job") == {"job@race": won[0]}
        assert summaries(opened[0])["job"].counts == {"t": 1}

    def test_an_expired_record_counts_as_absent(self, store: Store) -> None:
        a = store.open()
        ttl = 1.0
        assert a.runs.put(ELECTION, RunWrite("job@old", None, "v1", ttl))[0]
        # etcd keeps a record up to twice its ttl (leases are shared): wait for both.
        wait_for(lambda: "job@old" not in runs(a, "job"), timeout=4 * ttl + 3)
        assert a.runs.put(ELECTION, RunWrite("job@old", "v1", "v2", 60))[0] is False
        assert a.runs.put(ELECTION, RunWrite("job@old", None, "v3", 60)) == (True, "v3")
        assert runs(a, "job") == {"job@old": "v3"}

    def test_an_entrys_summary_follows_its_writes(self, store: Store) -> None:
        """What ``leader status`` reads: per entry, its greatest slot and the tallies of
        the records kept, moved by every write (a record changing tally moves both)."""
        a = store.open()
        a.runs.put(ELECTION, RunWrite("a@01", None, "sent-1", 60, tally="sent"))
        a.runs.put(ELECTION, RunWrite("a@02", None, "sent-2", 60, tally="sent"))
        a.runs.put(ELECTION, RunWrite("a@01", "sent-1", "ok-1", 60, tally="success"))
        a.runs.put(ELECTION, RunWrite("b@01", None, "x", 60))
        a.runs.put(ELECTION, RunWrite("@entry/a", None, "mark", 60))
        got = summaries(a)
        assert sorted(got) == ["a", "b"]
        assert (got["a"].last_key, got["a"].last) == ("a@02", "sent-2")
        assert got["a"].counts == {"sent": 1, "success": 1}
        assert (got["b"].last_key, got["b"].last, got["b"].counts) == ("b@01", "x", {})

    def test_runs_of_reads_the_newest_first_up_to_a_limit(self, store: Store) -> None:
        """Newest created: a slot's record is created when it is sent or started, in
        slot order, and its later writes (started, finished) do not move it."""
        a = store.open()
        for i in range(5):
            a.runs.put(ELECTION, RunWrite(f"e@{i}", None, f"v{i}", 60))
            time.sleep(0.002)  # SQL stores order by the server's clock
        a.runs.put(ELECTION, RunWrite("e@1", "v1", "w1", 60))
        assert a.runs.runs_of(ELECTION, "e", 3) == [("e@4", "v4"), ("e@3", "v3"), ("e@2", "v2")]
        assert a.runs.runs_of(ELECTION, "e", 10)[3] == ("e@1", "w1")
        assert a.runs.runs_of(ELECTION, "f", 3) == []

    def test_keep_caps_an_entrys_records_and_its_counts(self, store: Store) -> None:
        a = store.open()
        for i in range(6):
            a.runs.put(ELECTION, RunWrite(f"e@{i}", None, f"v{i}", 60, keep=3, tally="ok"))
            time.sleep(0.002)
        assert runs(a, "e") == {"e@3": "v3", "e@4": "v4", "e@5": "v5"}
        got = summaries(a)["e"]
        assert (got.last_key, got.counts) == ("e@5", {"ok": 3})

    def test_expiry_takes_an_entrys_records_and_counts_with_it(self, store: Store) -> None:
        a = store.open()
        a.runs.put(ELECTION, RunWrite("gone@1", None, "x", 1.0, tally="ok"))
        a.runs.put(ELECTION, RunWrite("live@1", None, "y", 1.0, tally="ok"))
        a.runs.put(ELECTION, RunWrite("live@2", None, "z", 60, tally="ok"))
        # etcd keeps a record up to twice its ttl (leases are shared): wait for both.
        wait_for(lambda: "gone" not in summaries(a) and len(runs(a, "live")) == 1, timeout=7)
        a.runs.put(
            ELECTION, RunWrite("live@3", None, "w", 60, tally="ok")
        )  # a write drops what expired
        assert summaries(a)["live"].counts == {"ok": 2}

    def test_an_entry_written_again_after_it_expired_counts_afresh(self, store: Store) -> None:
        """An entry that stopped (its records expired, some of them dropped meanwhile by
        other entries' writes) and comes back counts and caps only its new records."""
        a = store.open()
        for i in range(3):
            a.runs.put(ELECTION, RunWrite(f"back@{i}", None, "x", 1.0, keep=2, tally="ok"))
        # etcd keeps a record up to twice its ttl (leases are shared): wait for both.
        wait_for(lambda: "back" not in summaries(a), timeout=7)
        for i in range(3):
            a.runs.put(ELECTION, RunWrite(f"other@{i}", None, "y", 60))  # may drop back's rows
        a.runs.put(ELECTION, RunWrite("back@3", None, "z", 60, keep=2, tally="ok"))
        a.runs.put(ELECTION, RunWrite("back@4", None, "z", 60, keep=2, tally="ok"))
        assert runs(a, "back") == {"back@3": "z", "back@4": "z"}
        assert summaries(a)["back"].counts == {"ok": 2}

    def test_a_record_of_the_previous_release_is_compared_with_and_moved(
        self, store: Store
    ) -> None:
        """An upgrade keeps the records it finds: a worker still sees that a slot ran
        (or was sent) and takes a sent slot over, and the record moves to its entry."""
        if store.legacy_run is None:
            pytest.skip("records in process memory never outlive a release")
        a = store.open()
        a.runs.put(
            ELECTION, RunWrite("@ledger-since", None, "{}", 60)
        )  # SQL stores make their tables
        store.legacy_run("old@1", "ran")
        store.legacy_run("old@2", "sent")
        assert a.runs.put(ELECTION, RunWrite("old@1", None, "again", 60, tally="t")) == (
            False,
            "ran",
        )
        assert a.runs.put(ELECTION, RunWrite("old@2", "sent", "started", 60, tally="t")) == (
            True,
            "started",
        )
        assert runs(a, "old") == {"old@2": "started"}
        assert marks.read(a.runs, ELECTION, "old@2", 60) == "started"
        assert summaries(a)["old"].counts == {"t": 1}
        assert a.runs.put(ELECTION, RunWrite("old@2", "sent", "x", 60))[0] is False, (
            "moved, not copied"
        )

    def test_a_store_that_is_down_raises_store_unavailable_only(self, store: Store) -> None:
        down = _down(store)
        _only_store_unavailable(
            lambda: down.runs.put(ELECTION, RunWrite("job@1", None, "x", 60)),
            lambda: down.runs.runs_of(ELECTION, "job", 10),
            lambda: down.runs.summaries(ELECTION),
        )


def _k(n: int) -> str:
    return f"{n:012d}"


class TestJournal:
    """The journal facet (:class:`~celery_leader.backends.Journal`): capped ordered logs
    any process writes, read newest first in pages."""

    def test_every_store_has_a_journal(self, store: Store) -> None:
        assert isinstance(store.open().journal, Journal)

    def test_a_lease_records_its_terms_in_the_journal(self, store: Store) -> None:
        """The term history end to end: a real lease writes its term when elected and
        completes it when it stops."""
        config = LeaderConfig.from_mapping(
            {"leader_url": store.url, "leader_key_prefix": PREFIX, "leader_instance_id": "a"}
        )
        leases = lease_set(config)
        try:
            lease = leases.join(ELECTION).lease
            wait_for(lease.is_leader, 5, message="never elected")
            epoch = lease.epoch
        finally:
            leases.stop()
        (term,) = term_history(store.open().journal, ELECTION, 10)
        assert (term.epoch, term.holder, term.how) == (epoch, "a", "stopping")

    def test_records_are_read_greatest_key_first_in_pages_and_another_process_sees_them(
        self, store: Store
    ) -> None:
        a, b = store.open(), store.open()
        assert a.journal.read(ELECTION, "terms", 10) == []
        terms = [JournalWrite("terms", _k(n), f"term {n}", 100) for n in (3, 1, 2)]
        a.journal.write(ELECTION, terms)
        assert b.journal.read(ELECTION, "terms", 10) == [
            (_k(3), "term 3"), (_k(2), "term 2"), (_k(1), "term 1")
        ]  # fmt: skip
        assert b.journal.read(ELECTION, "terms", 2) == [(_k(3), "term 3"), (_k(2), "term 2")]
        assert b.journal.read(ELECTION, "terms", 2, before=_k(2)) == [(_k(1), "term 1")]
        assert b.journal.read(ELECTION, "audit", 10) == [], "logs are apart"
        assert b.journal.read("other", "terms", 10) == [], "elections are apart"
        assert a.records.load(ELECTION) == {} and a.entries.load(ELECTION) == (0, {})

    def test_rewriting_a_key_replaces_its_record(self, store: Store) -> None:
        a = store.open()
        a.journal.write(ELECTION, [JournalWrite("terms", _k(7), '{"started": 1}', 10)])
        a.journal.write(ELECTION, [JournalWrite("terms", _k(7), '{"started": 1, "ended": 2}', 10)])
        assert a.journal.read(ELECTION, "terms", 10) == [(_k(7), '{"started": 1, "ended": 2}')]

    def test_a_log_keeps_its_greatest_keys_and_one_write_drops_all_that_fall_out(
        self, store: Store
    ) -> None:
        a = store.open()
        a.journal.write(ELECTION, [JournalWrite("audit", _k(n), str(n), 1000) for n in range(40)])
        a.journal.write(ELECTION, [JournalWrite("audit", _k(40), "40", 5)])
        kept = [(_k(n), str(n)) for n in range(40, 35, -1)]
        assert a.journal.read(ELECTION, "audit", 100) == kept
        a.journal.write(ELECTION, [JournalWrite("audit", _k(1), "old", 5)])
        assert [k for k, _ in a.journal.read(ELECTION, "audit", 100)] == [
            _k(n) for n in range(40, 35, -1)
        ], "a key older than the kept ones falls out at once"

    def test_one_call_writes_several_logs(self, store: Store) -> None:
        a = store.open()
        a.journal.write(
            ELECTION,
            [
                JournalWrite("audit", _k(1), "paused", 10),
                JournalWrite("audit/job", _k(1), "paused", 3),
            ],
        )
        assert a.journal.read(ELECTION, "audit", 10) == a.journal.read(ELECTION, "audit/job", 10)

    def test_a_call_ends_as_its_writes_one_by_one_would(self, store: Store) -> None:
        """Stores that apply a call's writes at once still honour their order: a key
        written twice keeps its last record, and a log's ``keep`` may change."""
        a = store.open()
        a.journal.write(ELECTION, [JournalWrite("terms", _k(n), str(n), 10) for n in range(1, 6)])
        a.journal.write(
            ELECTION,
            [
                JournalWrite("terms", _k(9), "first", 10),
                JournalWrite("terms", _k(9), "second", 10),
                JournalWrite("terms", _k(0), "zero", 3),  # leaves 4, 5, 9
                JournalWrite("terms", _k(8), "eight", 3),  # leaves 5, 8, 9
                JournalWrite("terms", _k(6), "six", 10),
                JournalWrite("audit", _k(1), "other log", 1),
            ],
        )
        assert a.journal.read(ELECTION, "terms", 10) == [
            (_k(9), "second"), (_k(8), "eight"), (_k(6), "six"), (_k(5), "5")
        ]  # fmt: skip
        assert a.journal.read(ELECTION, "audit", 10) == [(_k(1), "other log")]

    def test_records_and_log_names_keep_any_text(self, store: Store) -> None:
        a = store.open()
        text = '{"why": "caf\u00e9 \u2615 \\" \' %s ; -- \n"}'
        log = "audit/entry with spaces:and:colons/\u00e9"
        a.journal.write(ELECTION, [JournalWrite(log, _k(1), text, 10)])
        assert a.journal.read(ELECTION, log, 10) == [(_k(1), text)]

    def test_a_store_that_is_down_raises_store_unavailable_only(self, store: Store) -> None:
        down = _down(store)
        _only_store_unavailable(
            lambda: down.journal.write(ELECTION, [JournalWrite("terms", _k(1), "x", 10)]),
            lambda: down.journal.read(ELECTION, "terms", 10),
        )
