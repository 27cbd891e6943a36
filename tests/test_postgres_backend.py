"""The PostgreSQL store against a real PostgreSQL 15: what only this store does, then
real processes and faults. The facets' contract is in tests/test_backend_contract.py.

Times are ``time.monotonic()`` (CLOCK_MONOTONIC, system-wide on Linux), so the
times lease processes print compare directly with the test's own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import sql

from celery_leader import Lease
from celery_leader.backends import Fence, JournalWrite, Renewal, StoreFacets, StoreParams, Write
from celery_leader.backends.postgres import advisory_key, open_store
from celery_leader.backends.postgres.sql import PUT_JOURNAL, STATE_OF
from celery_leader.backends.sql_facets import JOURNAL_PAGE, JOURNAL_PAGE_BEFORE
from celery_leader.election.events import Callbacks
from celery_leader.election.timing import DRIFT, MARGIN, store_timeout
from celery_leader.exceptions import ConfigError, StoreMisconfigured, StoreUnavailable
from harness.procs import Proc, Procs
from harness.procs import signal as send_signal
from harness.proxy import TcpProxy
from harness.servers import PostgresServer
from harness.waiting import wait_for
from tests.entry_upgrades import read_by_change_after_the_upgrade

pytestmark = pytest.mark.postgres

PREFIX = "t"
ELECTION = "beat"


@pytest.fixture
def stores(postgres_url: str) -> Iterator[Callable[..., StoreFacets]]:
    """Factory of stores on the test database; all closed at teardown."""
    made: list[StoreFacets] = []

    def make(url: str = postgres_url, timeout: float = 0.5) -> StoreFacets:
        store = open_store(StoreParams(url, PREFIX, timeout))
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def superuser(server: PostgresServer) -> psycopg.Connection[Any]:
    """Superuser connection to the leader database."""
    return psycopg.connect(server.superuser_url.rsplit("/", 1)[0] + "/leader", autocommit=True)


# The entries tables as the previous release made them, and its edit of an entry.
PREVIOUS_ENTRIES_TABLES = """
CREATE TABLE celery_leader_entries (
    prefix text NOT NULL, election text NOT NULL, name text NOT NULL, value text NOT NULL,
    PRIMARY KEY (prefix, election, name)
);
CREATE TABLE celery_leader_entries_version (
    prefix text NOT NULL, election text NOT NULL, version bigint NOT NULL,
    PRIMARY KEY (prefix, election)
)
"""
PREVIOUS_REPLACE_ENTRY = """
WITH e AS (
    UPDATE celery_leader_entries SET value = %(new)s
    WHERE prefix = %(prefix)s AND election = %(election)s AND name = %(name)s
      AND value = %(expected)s
    RETURNING 1
),
v AS (
    INSERT INTO celery_leader_entries_version AS v (prefix, election, version)
    SELECT %(prefix)s, %(election)s, 1 FROM e
    ON CONFLICT (prefix, election) DO UPDATE SET version = v.version + 1
)
SELECT count(*) FROM e
"""


def test_entries_of_the_previous_release_are_read_by_change_after_the_first_edit(
    postgres_url: str, stores: Callable[..., StoreFacets]
) -> None:
    """See :mod:`tests.entry_upgrades`."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(PREVIOUS_ENTRIES_TABLES)
        conn.execute(
            "INSERT INTO celery_leader_entries VALUES (%s, %s, 'x', 'x1')", (PREFIX, ELECTION)
        )
        conn.execute(
            "INSERT INTO celery_leader_entries_version VALUES (%s, %s, 3)", (PREFIX, ELECTION)
        )

    def edit_by_previous() -> None:
        params = {"prefix": PREFIX, "election": ELECTION, "name": "x"}
        params |= {"expected": "x1", "new": "x2"}
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            assert conn.execute(PREVIOUS_REPLACE_ENTRY, params).fetchall() == [(1,)]

    read_by_change_after_the_upgrade(stores(), stores(), ELECTION, edit_by_previous)


def test_the_journal_joins_the_tables_of_the_previous_release(
    postgres_url: str, stores: Callable[..., StoreFacets]
) -> None:
    assert stores().entries.load(ELECTION) == (0, {})  # every table made
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("DROP TABLE celery_leader_journal")  # as the previous release left them
    store = stores()
    store.journal.write(ELECTION, [JournalWrite("terms", "7", "x", 5)])
    assert store.journal.read(ELECTION, "terms", 5) == [("7", "x")]


def test_the_journal_reads_and_trims_by_the_primary_key(
    postgres_url: str, stores: Callable[..., StoreFacets]
) -> None:
    """A page of a log and a write's trim cost their rows, not the table's."""
    store = stores()
    for n in range(40):
        rows = [JournalWrite(f"audit/job{n}", f"{k:020d}", "x" * 200, 100) for k in range(100)]
        store.journal.write(ELECTION, rows)
    params = {"prefix": PREFIX, "election": ELECTION, "log": "audit/job7", "limit": 20}
    write = {"logs": ["audit/job7"], "keys": [f"{100:020d}"], "data": ["y"], "keeps": [100]}
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("ANALYZE celery_leader_journal")
        for query, more in [
            (JOURNAL_PAGE, {}),
            (JOURNAL_PAGE_BEFORE, {"before": f"{50:020d}"}),
            (PUT_JOURNAL, write),
        ]:
            plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + query, params | more))
            assert "celery_leader_journal_pkey" in plan and "Seq Scan" not in plan, plan


def test_claims_cost_their_batch_not_the_table(stores: Callable[..., StoreFacets]) -> None:
    """Batches of 1,000 claims over 20,000 entries, as a burst claims them: past psycopg's
    fifth run (it then prepares the statement) and the server's fifth custom plan, on a
    table too young for statistics. A join of claims with the table joined each claim
    with every row of the election here (seconds per batch, past the store deadline);
    by the key, each batch takes about what it takes on an empty table."""
    store = stores(timeout=2.0)
    term = store.lock.acquire(ELECTION, "a", 30.0, 0).term
    assert term is not None
    fence = Fence(ELECTION, term)
    names = [f"e{i}" for i in range(20_000)]
    state: dict[str, str | None] = dict.fromkeys(names)
    for version in range(2):
        for start in range(0, len(names), 1000):
            writes = [Write(n, state[n], f"{n}/{version}") for n in names[start : start + 1000]]
            assert store.records.claim(fence, writes) == [True] * len(writes)
            state.update((w.key, w.new) for w in writes)
    assert store.records.load(ELECTION) == state


def test_state_of_some_keys_is_read_by_the_key_in_every_plan(
    postgres_url: str, stores: Callable[..., StoreFacets]
) -> None:
    """A new term loads its state 2,000 keys a statement. Once psycopg prepares the
    statement, the server may switch to a generic plan, and a table filled since its
    last statistics (a fresh schedule's anchors) misleads a custom one: in both, each
    key must be one lookup of the primary key. ``entry = ANY(keys)`` compared every row
    with every key in the generic plan (2.6 s a chunk at 100,000 rows)."""
    store = stores()
    assert store.records.load(ELECTION) == {}  # the tables made
    names = [f"e{i}" for i in range(100_000)]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        # A schedule's anchors as a new leader's claims write them, in one statement.
        conn.execute(
            "INSERT INTO celery_leader_state (prefix, election, entry, value)"
            " SELECT %s, %s, 'e' || i, '{}' FROM generate_series(0, 99999) AS i",
            (PREFIX, ELECTION),
        )
    assert store.records.load_some(ELECTION, [*names[:3], "absent"]) == dict.fromkeys(
        names[:3], "{}"
    )
    # The statement as the server prepares it: its parameters numbered.
    prepared = STATE_OF
    for number, name in enumerate(("prefix", "election", "keys"), 1):
        prepared = prepared.replace(f"%({name})s", f"${number}")
    args = sql.SQL(", ").join(map(sql.Literal, (PREFIX, ELECTION, names[5000:7000])))
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"PREPARE state_of (text, text, text[]) AS {prepared}")
        for mode in ("force_generic_plan", "force_custom_plan"):
            conn.execute(f"SET plan_cache_mode = {mode}")
            explain = conn.execute(sql.SQL("EXPLAIN EXECUTE state_of ({})").format(args))
            plan = "\n".join(row[0] for row in explain)
            conds = [line for line in plan.splitlines() if "Index Cond" in line]
            # Each lookup names its key; a Filter would compare keys with rows read.
            assert conds and all("entry =" in c for c in conds), (mode, plan)
            assert "Seq Scan" not in plan and "Filter" not in plan, (mode, plan)


def test_claims_join_the_tables_of_the_previous_release(
    postgres_url: str, stores: Callable[..., StoreFacets]
) -> None:
    """The claim function is made on first use beside tables an earlier release made."""
    assert stores().entries.load(ELECTION) == (0, {})  # every table made
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("DROP FUNCTION celery_leader_claim")
    store = stores()
    term = store.lock.acquire(ELECTION, "a", 5.0, 0).term
    assert term is not None
    assert store.records.claim(Fence(ELECTION, term), [Write("x", None, "1")]) == [True]
    assert store.records.load(ELECTION) == {"x": "1"}


def test_lock_key_is_documented_and_visible_in_pg_locks(
    postgres_server: PostgresServer, stores: Callable[..., StoreFacets]
) -> None:
    key = advisory_key(PREFIX, ELECTION)
    digest = hashlib.sha256(f"{PREFIX}:{ELECTION}".encode()).digest()
    assert key == int.from_bytes(digest[:8], "big", signed=True)
    result = stores().lock.acquire(ELECTION, "a", 5.0, 0)
    assert result.term is not None
    with superuser(postgres_server) as conn:
        row = conn.execute(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            " WHERE l.locktype = 'advisory' AND l.classid = %s::oid AND l.objid = %s::oid"
            " AND l.objsubid = 1 AND l.granted",
            ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
        ).fetchone()
    assert row == ("celery-leader",)


def test_a_session_ended_by_the_server_loses_everything(
    postgres_server: PostgresServer, stores: Callable[..., StoreFacets]
) -> None:
    a, b = stores(), stores()
    term = a.lock.acquire(ELECTION, "a", 5.0, 0).term
    assert term is not None
    with superuser(postgres_server) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM celery_leader_lease"
            " WHERE prefix = %s AND election = %s",
            (PREFIX, ELECTION),
        )
    # The next claim finds the session gone: nothing is written, nothing raised.
    assert a.records.claim(Fence(ELECTION, term), [Write("slot", None, "stale")]) == [False]
    assert a.lock.renew(ELECTION, term, 5.0)[0] is Renewal.LOST
    a.lock.release(ELECTION, term)  # nothing left to release: no error
    taken = b.lock.acquire(ELECTION, "b", 5.0, 0)
    assert taken.term is not None and taken.term.epoch == 2
    assert b.records.load(ELECTION) == {}


@pytest.mark.timing  # freed within 0.5 s of the ttl
def test_idle_session_timeout_frees_the_lock_no_earlier_than_the_belief(
    stores: Callable[..., StoreFacets],
) -> None:
    ttl = 1.0
    a, b = stores(), stores()
    sent = time.monotonic()
    term = a.lock.acquire(ELECTION, "a", ttl, 0).term  # and never renewed: a "paused" holder
    assert term is not None
    assert b.lock.acquire(ELECTION, "b", ttl, 0).term is None
    b.lock.wait(ELECTION, ttl + 2, threading.Event())
    taken = b.lock.acquire(ELECTION, "b", ttl, 0)
    won = time.monotonic()
    assert taken.term is not None
    # The holder's belief (what Lease trusts after `sent`) ended before b won...
    assert won > sent + ttl * (1 - DRIFT) - MARGIN
    # ...and the server did not keep the lock much longer than the ttl.
    assert won - sent < ttl + 0.5
    # The claim goes to the dead session first (the server's goodbye is still
    # unread on its socket), then the renewal finds the term gone.
    assert a.records.claim(Fence(ELECTION, term), [Write("slot", None, "stale")]) == [False]
    assert a.lock.renew(ELECTION, term, ttl)[0] is Renewal.LOST
    assert b.records.load(ELECTION) == {}


def test_a_follower_that_leaves_holds_nothing(stores: Callable[..., StoreFacets]) -> None:
    a, b, c, d = stores(), stores(), stores(), stores()
    term = a.lock.acquire(ELECTION, "a", 5.0, 0).term
    assert term is not None
    assert b.lock.acquire(ELECTION, "b", 5.0, 0).term is None
    assert c.lock.acquire(ELECTION, "c", 5.0, 0).term is None
    b.lock.release(ELECTION, None)  # leaves while queued

    # c's waiter is granted the lock when a releases; c leaves without taking it.
    a.lock.release(ELECTION, term)
    c.lock.wait(ELECTION, 5.0, threading.Event())
    c.lock.release(ELECTION, None)
    got = wait_for(
        lambda: d.lock.acquire(ELECTION, "d", 5.0, 0).term, 2.0, message="a lock was left behind"
    )
    assert got.epoch == 2


def test_a_pooled_connection_is_refused(stores: Callable[..., StoreFacets]) -> None:
    a = stores()
    term = a.lock.acquire(ELECTION, "a", 5.0, 0).term
    assert term is not None
    # What a transaction-mode pooler does: the next statement runs in another
    # server session. Simulated by making the store remember another pid.
    session = a.lock._db.holding(ELECTION, term)
    assert session is not None
    session.pid += 1
    with pytest.raises(StoreMisconfigured, match="PgBouncer"):
        a.lock.renew(ELECTION, term, 5.0)


# -- bad input: one clear line ---------------------------------------------------


def _one_clear_line(exc: BaseException, *needles: str) -> str:
    message = str(exc)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, message
    return message


def test_store_errors_are_one_clear_line(
    postgres_server: PostgresServer, stores: Callable[..., StoreFacets], postgres_url: str
) -> None:
    wrong = postgres_url.replace(":leaderpw@", ":hunter2@")
    with pytest.raises(StoreUnavailable) as info:
        stores(wrong).lock.acquire(ELECTION, "a", 5.0, 0)
    message = _one_clear_line(
        info.value, 'password authentication failed for user "leader"', "leader:***@127.0.0.1"
    )
    assert "hunter2" not in message

    missing = postgres_url.rsplit("/", 1)[0] + "/nosuchdb"
    with pytest.raises(StoreUnavailable) as info:
        stores(missing).lock.holder(ELECTION)
    message = _one_clear_line(info.value, 'database "nosuchdb" does not exist')
    assert "leaderpw" not in message

    closed_port = postgres_url.replace(f":{postgres_server.port}/", ":1/")
    with pytest.raises(StoreUnavailable) as info:
        stores(closed_port).lock.acquire(ELECTION, "a", 5.0, 0)
    _one_clear_line(info.value, "Connection refused")

    with pytest.raises(ConfigError) as config_info:
        open_store(StoreParams(postgres_url + "?nosuchoption=1", PREFIX, 0.5))
    message = _one_clear_line(config_info.value, "nosuchoption")
    assert "leaderpw" not in message


def test_server_older_than_14_is_refused_in_one_line(
    stores: Callable[..., StoreFacets], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(psycopg.ConnectionInfo, "server_version", property(lambda self: 130011))
    with pytest.raises(StoreMisconfigured) as info:
        stores().lock.acquire(ELECTION, "a", 5.0, 0)
    _one_clear_line(info.value, "PostgreSQL 13", "idle_session_timeout", "14 or later")


def test_wrong_password_is_logged_once_and_recovers_when_fixed(
    postgres_server: PostgresServer,
    stores: Callable[..., StoreFacets],
    postgres_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Decision: a store that refuses us is StoreUnavailable, not a crash.

    The lease logs the one-line reason once, nobody leads, and it keeps trying
    every renew interval, so fixing the password (or creating the database)
    needs no restart.
    """
    caplog.set_level(logging.WARNING, logger="celery_leader")
    store = stores(postgres_url.replace(":leaderpw@", ":newpw@"))
    lease = Lease(ELECTION, store.lock, ttl=1.0, renew_interval=0.2, instance_id="a")
    lease.start()
    try:
        wait_for(lambda: len(_store_warnings(caplog)) >= 1, 5.0, message="no warning logged")
        # Several more attempts fail the same way and say nothing new.
        time.sleep(0.5)  # ~2 renew intervals of retries; what is asserted is their silence
        warnings = _store_warnings(caplog)
        assert len(warnings) == 1, warnings
        _one_clear_line_text(warnings[0], "password authentication failed", "leader:***@")
        assert "newpw" not in caplog.text
        assert not lease.is_leader()
        with superuser(postgres_server) as conn:
            conn.execute("ALTER ROLE leader PASSWORD 'newpw'")
        wait_for(lease.is_leader, 3.0, message="lease did not recover after the password fix")
    finally:
        lease.stop()
        with superuser(postgres_server) as conn:
            conn.execute(f"ALTER ROLE leader PASSWORD '{postgres_server.password}'")


def _store_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "retrying; nobody can lead" in r.getMessage()]


def _one_clear_line_text(text: str, *needles: str) -> None:
    assert "\n" not in text, text
    for needle in needles:
        assert needle in text, text


def test_django_alias(postgres_url: str, procs: Procs) -> None:
    parts = urlsplit(postgres_url)
    code = textwrap.dedent(
        f"""
        import django
        from django.conf import settings
        settings.configure(DATABASES={{
            "default": {{
                "ENGINE": "django.db.backends.postgresql",
                "NAME": {parts.path.lstrip("/")!r}, "USER": {parts.username!r},
                "PASSWORD": {parts.password!r}, "HOST": {parts.hostname!r},
                "PORT": {str(parts.port)!r}, "OPTIONS": {{"server_side_binding": False}},
            }},
            "lite": {{"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        }})
        django.setup()
        from celery_leader.backends import open_store
        from celery_leader.settings.config import LeaderConfig
        from celery_leader.exceptions import ConfigError

        def config(url):
            return LeaderConfig.from_mapping({{"leader_url": url, "leader_key_prefix": "dj"}})

        store = open_store(config("django://default"))
        print("EPOCH", store.lock.acquire("beat", "a", 5.0, 0).term.epoch)
        print("TARGET", store.lock._db.target)
        for url in ("django://lite", "django://nope"):
            try:
                open_store(config(url))
            except ConfigError as exc:
                print("ERROR", exc)
        """
    )
    proc = procs.spawn_python(code)
    assert proc.wait(30) == 0, proc.output()
    lines = proc.lines()
    assert "EPOCH 1" in lines, proc.output()
    target = f"TARGET django://default (database {parts.path.lstrip('/')!r} on {parts.hostname})"
    assert target in lines, proc.output()
    errors = [line for line in lines if line.startswith("ERROR")]
    assert len(errors) == 2, proc.output()
    assert "ENGINE 'django.db.backends.sqlite3'" in errors[0]
    assert "needs PostgreSQL" in errors[0]
    assert "no 'nope'" in errors[1] and "'default'" in errors[1]


# -- real processes ----------------------------------------------------------------

# One Lease in a process of its own. It prints one JSON event per line; "bound"
# is an upper bound of the lease's belief, printed before the lease can act on
# the answer it covers (the lease took its own `sent` before ours).
LEASE_SCRIPT = """
import json, os, signal, sys, time
from celery_leader.backends import Fence, Renewal, StoreParams, Write
from celery_leader.backends.postgres import open_store
from celery_leader.election.timing import DRIFT, MARGIN, store_timeout
from celery_leader.election.events import Callbacks
from celery_leader.election.lease import Lease

url, name, ttl, renew = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
validity = ttl * (1 - DRIFT) - MARGIN

def emit(event, **fields):
    line = json.dumps({"event": event, "name": name, "t": time.monotonic(), **fields})
    os.write(1, (line + "\\n").encode())  # one write: safe from a signal handler

store = open_store(StoreParams(url, "chaos", store_timeout(ttl, renew)))
lock = store.lock
acquire, renewal = lock.acquire, lock.renew

def recording_acquire(election, instance_id, ttl, min_epoch):
    sent = time.monotonic()
    result = acquire(election, instance_id, ttl, min_epoch)
    if result.term is not None:
        emit("bound", epoch=result.term.epoch, bound=sent + validity)
    return result

def recording_renew(election, term, ttl):
    sent = time.monotonic()
    result, store_time = renewal(election, term, ttl)
    if result is not Renewal.LOST:
        emit("bound", epoch=term.epoch, bound=sent + validity)
    return result, store_time

lock.acquire, lock.renew = recording_acquire, recording_renew

terms = []

def elected(lease):
    terms.append(lease.term)
    emit("elected", epoch=lease.epoch)

lease = Lease("beat", lock, ttl=ttl, renew_interval=renew, instance_id=name,
              callbacks=Callbacks(on_started=elected, on_stopped=lambda lease: emit("demoted")))

def on_cont(signum, frame):
    leader = lease.is_leader()  # the first thing this process does after the pause
    try:
        claims = store.records.claim(Fence("beat", terms[-1]), [Write("slot", None, name)])
    except Exception as exc:
        claims = repr(exc)
    emit("resumed", leader=leader, claims=claims)

def on_term(signum, frame):
    lease.stop()
    emit("stopped")
    os._exit(0)

signal.signal(signal.SIGCONT, on_cont)
signal.signal(signal.SIGTERM, on_term)
lease.start()
emit("started")
while True:
    time.sleep(1)  # signal handlers run in this thread
"""


@pytest.fixture
def lease_script(tmp_path: Path) -> Path:
    path = tmp_path / "lease_proc_pg.py"
    path.write_text(LEASE_SCRIPT)
    return path


class Cluster:
    """Lease processes on one election, and what they printed."""

    def __init__(self, procs: Procs, script: Path, url: str, ttl: float, renew: float) -> None:
        self.procs, self.script, self.url = procs, script, url
        self.ttl, self.renew = ttl, renew
        self.members: dict[str, Proc] = {}

    def spawn(self, *names: str) -> None:
        for name in names:
            self.members[name] = self.procs.spawn_python(
                self.script, self.url, name, str(self.ttl), str(self.renew)
            )
        for name in names:
            self.members[name].wait_for_line('"event": "started"', 30)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        out = []
        for member, proc in self.members.items():
            if name not in (None, member):
                continue
            for line in proc.lines():
                if line.startswith("{"):
                    out.append(json.loads(line))
        return sorted(out, key=lambda e: e["t"])

    def leaders(self) -> list[str]:
        """Members whose last word was "elected"."""
        last: dict[str, str] = {}
        for event in self.events():
            if event["event"] in ("elected", "demoted"):
                last[event["name"]] = event["event"]
        return sorted(name for name, event in last.items() if event == "elected")

    def elected_after(self, t: float, timeout: float) -> dict[str, Any]:
        return wait_for(
            lambda: next(
                (e for e in self.events() if e["event"] == "elected" and e["t"] > t), None
            ),
            timeout,
            message=lambda: f"nobody elected; events: {self.events()}",
        )

    def elections(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["event"] == "elected"]


def _report(label: str, seconds: float) -> None:
    print(f"[postgres handover] {label}: {seconds * 1000:.1f} ms")


@pytest.mark.timing  # hand-overs within 0.5 s
def test_crash_and_graceful_stop_hand_over_within_half_a_second(
    postgres_url: str, procs: Procs, lease_script: Path
) -> None:
    # A long ttl on purpose: neither hand-over may wait for it.
    cluster = Cluster(procs, lease_script, postgres_url, ttl=10.0, renew=2.0)
    cluster.spawn("a", "b", "c")
    first = cluster.elected_after(0, 10)

    killed_at = time.monotonic()
    cluster.members[first["name"]].kill_group()
    second = cluster.elected_after(killed_at, 5)
    _report("SIGKILL of the holder -> follower elected", second["t"] - killed_at)
    assert second["t"] - killed_at < 0.5

    stopped_at = time.monotonic()
    send_signal(cluster.members[second["name"]], signal.SIGTERM)  # Lease.stop()
    third = cluster.elected_after(stopped_at, 5)
    _report("graceful stop of the holder -> follower elected", third["t"] - stopped_at)
    assert third["t"] - stopped_at < 0.5

    assert len({first["name"], second["name"], third["name"]}) == 3
    assert [e["epoch"] for e in cluster.elections()] == [
        first["epoch"],
        first["epoch"] + 1,
        first["epoch"] + 2,
    ]


@pytest.mark.timing  # taken within 0.5 s of the ttl
def test_paused_holder_loses_the_lock_on_time(
    postgres_url: str, procs: Procs, lease_script: Path
) -> None:
    ttl, renew = 2.0, 0.5
    cluster = Cluster(procs, lease_script, postgres_url, ttl=ttl, renew=renew)
    cluster.spawn("a", "b")
    first = cluster.elected_after(0, 10)
    paused = cluster.members[first["name"]]
    # Let it renew a few times, so the pause starts from a steady state.
    wait_for(
        lambda: len([e for e in cluster.events(first["name"]) if e["event"] == "bound"]) >= 3,
        5,
        message="no renewals",
    )

    stopped_at = time.monotonic()
    send_signal(paused, signal.SIGSTOP)
    second = cluster.elected_after(stopped_at, ttl + 2)
    _report(f"SIGSTOP of the holder (ttl {ttl:g} s) -> follower elected", second["t"] - stopped_at)
    # The server ended the paused session ttl after its last statement...
    assert second["t"] - stopped_at <= ttl + 0.5
    assert second["t"] - stopped_at >= ttl - renew - 0.05
    # ...which is after the paused holder's belief ran out.
    last_bound = max(e["bound"] for e in cluster.events(first["name"]) if e["event"] == "bound")
    assert second["t"] > last_bound

    send_signal(paused, signal.SIGCONT)
    resumed = wait_for(
        lambda: next((e for e in cluster.events(first["name"]) if e["event"] == "resumed"), None),
        5,
        message="paused process said nothing after SIGCONT",
    )
    assert resumed["leader"] is False
    assert resumed["claims"] == [False]
    wait_for(
        lambda: cluster.leaders() == [second["name"]], 2, message="the paused one never demoted"
    )
    store = open_store(StoreParams(postgres_url, "chaos", 0.5))
    try:
        assert store.records.load(ELECTION) == {}
    finally:
        store.close()


def test_postgres_restart(
    postgres_server: PostgresServer, postgres_url: str, procs: Procs, lease_script: Path
) -> None:
    ttl, renew = 2.0, 0.5
    cluster = Cluster(procs, lease_script, postgres_url, ttl=ttl, renew=renew)
    cluster.spawn("a", "b")
    first = cluster.elected_after(0, 10)

    down_at = time.monotonic()
    postgres_server.stop()
    stopped_at = time.monotonic()
    # The old leader finds its session gone at its next renewal.
    wait_for(lambda: not cluster.leaders(), renew + 0.5, message="old leader kept leading")
    demoted = max(e["t"] for e in cluster.events() if e["event"] == "demoted")
    _report("PostgreSQL stopped -> old leader demoted", demoted - down_at)
    # Nobody leads while the server is down (every instance retries meanwhile).
    quiet_until = time.monotonic() + 2 * renew
    while time.monotonic() < quiet_until:
        assert not cluster.leaders()
        time.sleep(0.02)

    postgres_server.start()
    up_at = time.monotonic()
    second = cluster.elected_after(stopped_at, renew + 1 + (up_at - stopped_at))
    _report("PostgreSQL accepting again -> leader elected", second["t"] - up_at)
    assert second["t"] - up_at <= renew + 1
    assert second["epoch"] > first["epoch"]
    assert len(cluster.leaders()) == 1


@pytest.mark.timing  # taken within 0.5 s of the ttl
def test_cut_off_holder_loses_the_lock_on_time(
    postgres_server: PostgresServer,
    stores: Callable[..., StoreFacets],
    postgres_url: str,
    tcp_proxy: Callable[[str, int], TcpProxy],
) -> None:
    """A holder behind a stalled network: it demotes itself, the server frees the lock."""
    ttl, renew = 1.5, 0.5
    proxy = tcp_proxy("127.0.0.1", postgres_server.port)
    times: dict[str, list[float]] = {"elected": [], "demoted": []}

    def record(kind: str) -> Callable[[Lease], None]:
        return lambda lease: times[kind].append(time.monotonic())

    cut_off = Lease(
        ELECTION,
        stores(proxy.url_for(postgres_url), timeout=store_timeout(ttl, renew)).lock,
        ttl=ttl,
        renew_interval=renew,
        instance_id="cut",
        callbacks=Callbacks(on_started=record("elected"), on_stopped=record("demoted")),
    )
    cut_off.start()
    direct = Lease(
        ELECTION,
        stores(timeout=store_timeout(ttl, renew)).lock,
        ttl=ttl,
        renew_interval=renew,
        instance_id="direct",
    )
    try:
        wait_for(cut_off.is_leader, 5, message="the proxied lease was not elected")
        direct.start()
        time.sleep(renew)  # the direct one is queued now; what is asserted below is timing
        held_at = time.monotonic()
        proxy.hold()
        wait_for(direct.is_leader, ttl + 1, message="the lock was never freed")
        taken = time.monotonic()
        _report(f"network stall of the holder (ttl {ttl:g} s) -> follower leads", taken - held_at)
        assert taken - held_at <= ttl + 0.5
        assert times["demoted"] and times["demoted"][-1] < taken
        assert not cut_off.is_leader()
    finally:
        proxy.release()
        direct.stop()
        cut_off.stop()
