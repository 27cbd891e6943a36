"""The MySQL store against a real MariaDB: what only this store does. The facets'
contract is in tests/test_backend_contract.py, its faults with real processes in the
beat and Dramatiq chaos tests."""

from __future__ import annotations

import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest

from celery_leader.backends import Fence, JournalWrite, Renewal, StoreFacets, StoreParams, Write
from celery_leader.backends.mysql import lock_name, open_store
from celery_leader.backends.mysql.params import connection_params
from celery_leader.backends.mysql.sql import JOURNAL_DROP, JOURNAL_FLOOR
from celery_leader.backends.sql_facets import JOURNAL_PAGE, JOURNAL_PAGE_BEFORE
from celery_leader.election.timing import DRIFT, MARGIN
from celery_leader.exceptions import ConfigError, StoreMisconfigured, StoreUnavailable
from harness.procs import Procs
from harness.proxy import TcpProxy
from harness.servers import MariaDbServer
from harness.waiting import wait_for
from tests.entry_upgrades import read_by_change_after_the_upgrade

pytestmark = pytest.mark.mariadb

PREFIX = "t"
ELECTION = "beat"


@pytest.fixture
def stores(mariadb_url: str) -> Iterator[Callable[..., StoreFacets]]:
    """Factory of stores on the test database; all closed at teardown."""
    made: list[StoreFacets] = []

    def make(
        url: str = mariadb_url, timeout: float = 0.5, prefix: str = PREFIX, acks: int | None = None
    ) -> StoreFacets:
        store = open_store(StoreParams(url, prefix, timeout, replica_acks=acks))
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def _used_by(server: MariaDbServer, name: str) -> int | None:
    with server.root_connection() as conn, conn.cursor() as cur:
        cur.execute("SELECT IS_USED_LOCK(%s)", (name,))
        row = cur.fetchone()
    return None if row is None else row[0]


def test_long_names_are_hashed_and_the_readable_one_stays_in_the_table(
    mariadb_server: MariaDbServer, stores: Callable[..., StoreFacets]
) -> None:
    assert lock_name("leader", PREFIX, ELECTION) == "t:beat@leader"
    prefix = "p" * 80
    name = lock_name("leader", prefix, ELECTION)
    assert len(name) == 64 and name.startswith("celery_leader#")
    store = stores(prefix=prefix)
    term = store.lock.acquire(ELECTION, "a", 5.0, 0).term
    assert term is not None
    assert _used_by(mariadb_server, name) is not None
    with mariadb_server.root_connection() as conn, conn.cursor() as cur:
        cur.execute("SELECT prefix, election, lock_name FROM leader.celery_leader_lease")
        assert cur.fetchall() == ((prefix, ELECTION, name),)


# The entries tables as the previous release made them, and its edit of an entry.
PREVIOUS_ENTRIES_TABLES = [
    """CREATE TABLE leader.celery_leader_entries (
        prefix VARCHAR(190) NOT NULL, election VARCHAR(190) NOT NULL,
        name VARCHAR(190) NOT NULL, value MEDIUMTEXT NOT NULL,
        PRIMARY KEY (prefix, election, name)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin""",
    """CREATE TABLE leader.celery_leader_entries_version (
        prefix VARCHAR(190) NOT NULL, election VARCHAR(190) NOT NULL, version BIGINT NOT NULL,
        PRIMARY KEY (prefix, election)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin""",
]
PREVIOUS_REPLACE_ENTRY = [
    "UPDATE leader.celery_leader_entries SET value = 'x2'"
    " WHERE prefix = %(prefix)s AND election = %(election)s AND name = 'x' AND value = 'x1'",
    "UPDATE leader.celery_leader_entries_version SET version = version + 1"
    " WHERE prefix = %(prefix)s AND election = %(election)s",
]


def test_entries_of_the_previous_release_are_read_by_change_after_the_first_edit(
    mariadb_server: MariaDbServer, stores: Callable[..., StoreFacets]
) -> None:
    """See :mod:`tests.entry_upgrades`."""
    with mariadb_server.root_connection() as conn, conn.cursor() as cur:
        for statement in PREVIOUS_ENTRIES_TABLES:
            cur.execute(statement)
        cur.execute("INSERT INTO leader.celery_leader_entries VALUES (%s, %s, 'x', 'x1')",
                    (PREFIX, ELECTION))  # fmt: skip
        cur.execute("INSERT INTO leader.celery_leader_entries_version VALUES (%s, %s, 3)",
                    (PREFIX, ELECTION))  # fmt: skip
        conn.commit()

    def edit_by_previous() -> None:
        with mariadb_server.root_connection() as conn, conn.cursor() as cur:
            for statement in PREVIOUS_REPLACE_ENTRY:
                cur.execute(statement, {"prefix": PREFIX, "election": ELECTION})
            conn.commit()

    read_by_change_after_the_upgrade(stores(), stores(), ELECTION, edit_by_previous)


def test_the_journal_joins_the_tables_of_the_previous_release(
    mariadb_server: MariaDbServer, stores: Callable[..., StoreFacets]
) -> None:
    assert stores().entries.load(ELECTION) == (0, {})  # every table made
    with mariadb_server.root_connection() as conn, conn.cursor() as cur:
        cur.execute("DROP TABLE leader.celery_leader_journal")  # as the previous release left them
    store = stores()
    store.journal.write(ELECTION, [JournalWrite("terms", "7", "x", 5)])
    assert store.journal.read(ELECTION, "terms", 5) == [("7", "x")]


def test_an_entry_trail_of_any_190_character_name_fits_the_primary_key(
    stores: Callable[..., StoreFacets],
) -> None:
    """utf8mb4 takes 4 bytes a character and a key 3072 at most: the journal's
    columns are sized so that ``audit/`` and the longest entry name fit."""
    log = "audit/" + "\u00e9\u2615\U0001f600" * 63 + "x"
    key = f"{2**62:020d}-{'f' * 8}"
    store = stores(prefix="p" * 190)
    store.journal.write("e" * 190, [JournalWrite(log, key, "x", 5)])
    assert store.journal.read("e" * 190, log, 5) == [(key, "x")]


def test_the_journal_reads_and_trims_by_the_primary_key(
    mariadb_server: MariaDbServer, stores: Callable[..., StoreFacets]
) -> None:
    """A page of a log and a write's trim cost their rows, not the table's."""
    store = stores()
    for n in range(40):
        rows = [JournalWrite(f"audit/job{n}", f"{k:020d}", "x" * 200, 100) for k in range(100)]
        store.journal.write(ELECTION, rows)
    params = {"prefix": PREFIX, "election": ELECTION, "log": "audit/job7", "limit": 20}
    params |= {"before": f"{50:020d}", "log0": "audit/job7", "skip0": 99}
    trim = [JOURNAL_FLOOR.format(i=0), JOURNAL_DROP.format(i=0)]
    with mariadb_server.root_connection() as conn, conn.cursor() as cur:
        cur.execute("USE leader")
        cur.execute("ANALYZE TABLE celery_leader_journal")
        cur.execute("SET @celery_leader_floor = %(before)s", params)
        for query in [JOURNAL_PAGE, JOURNAL_PAGE_BEFORE, *trim]:
            cur.execute("EXPLAIN " + query, params)
            plans = cur.fetchall()
            assert [(p[2], p[3], p[5]) for p in plans] in (
                [("celery_leader_journal", "ref", "PRIMARY")],
                [("celery_leader_journal", "range", "PRIMARY")],
            ), plans
            assert all("filesort" not in str(p[-1]) for p in plans), plans


@pytest.mark.timing  # the loss seen within 0.5 s
def test_a_session_killed_by_the_server_loses_everything(
    mariadb_server: MariaDbServer, stores: Callable[..., StoreFacets]
) -> None:
    a, b = stores(), stores()
    term = a.lock.acquire(ELECTION, "a", 5.0, 0).term
    assert term is not None
    follower = b.lock.acquire(ELECTION, "b", 5.0, 0)
    assert follower.term is None and follower.holder is not None
    thread_id = _used_by(mariadb_server, lock_name("leader", PREFIX, ELECTION))
    killed = time.monotonic()
    with mariadb_server.root_connection() as conn, conn.cursor() as cur:
        cur.execute(f"KILL CONNECTION {int(thread_id or 0)}")
    # The queued follower is granted the lock the moment the session is gone.
    b.lock.wait(ELECTION, 5.0, threading.Event())
    assert time.monotonic() - killed < 0.5
    assert a.records.claim(Fence(ELECTION, term), [Write("slot", None, "stale")]) == [False]
    assert a.lock.renew(ELECTION, term, 5.0)[0] is Renewal.LOST
    a.lock.release(ELECTION, term)  # nothing left to release: no error
    taken = b.lock.acquire(ELECTION, "b", 5.0, 0)
    assert taken.term is not None and taken.term.epoch == 2
    assert b.records.load(ELECTION) == {}


def _waits(server: MariaDbServer, name: str) -> list[int]:
    """How long (ms) each statement queued for lock ``name`` has been waiting."""
    with server.root_connection() as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT TIME_MS FROM information_schema.PROCESSLIST WHERE INFO LIKE %s",
            (f"SELECT GET_LOCK('{name}'%",),
        )
        return [int(ms) for (ms,) in cur.fetchall()]


# Its bounds are a statement's age seen in a 0.5 s window, by polls that each connect,
# and a waiter whose every statement must answer within the 0.5 s store deadline (one
# that does not stops the waiter, as it should): on a loaded machine either misses.
@pytest.mark.timing
def test_a_follower_waits_a_ttl_per_statement_and_leaving_ends_its_wait_at_once(
    mariadb_server: MariaDbServer, stores: Callable[..., StoreFacets]
) -> None:
    """One GET_LOCK per ttl, past the store deadline (0.5 s here): not one per half
    deadline, which made a fleet's followers most of a server's statements."""
    name = lock_name("leader", PREFIX, ELECTION)
    a, b = stores(), stores()
    term = a.lock.acquire(ELECTION, "a", 3.0, 0).term
    assert term is not None
    assert b.lock.acquire(ELECTION, "b", 3.0, 0).term is None
    seen: list[list[int]] = []

    def past_two_deadlines() -> bool:
        seen.append(_waits(mariadb_server, name))
        return any(1000 < ms < 1500 for ms in seen[-1])

    # Two store deadlines into one statement (a 3 s slice): it outlived them.
    wait_for(
        past_two_deadlines, 5, message=lambda: f"no wait past the store deadline; saw {seen}"
    )
    b.lock.release(ELECTION, None)
    # The follower cut its connection, and the server dropped it from the queue
    # (MariaDB looks at a waiting connection about twice a second): before the
    # end of its slice, which is 1.5 s or more away.
    wait_for(lambda: _waits(mariadb_server, name) == [], 1.2, message="still queued")
    a.lock.release(ELECTION, term)
    assert _used_by(mariadb_server, name) is None, "granted to a follower that left"


def test_a_follower_that_waited_past_the_deadline_takes_over_and_renews(
    stores: Callable[..., StoreFacets],
) -> None:
    a, b = stores(), stores()
    term = a.lock.acquire(ELECTION, "a", 3.0, 0).term
    assert term is not None
    assert b.lock.acquire(ELECTION, "b", 3.0, 0).term is None
    time.sleep(1.5)  # three store deadlines queued: the case under test, not a wait for it
    a.lock.release(ELECTION, term)
    b.lock.wait(ELECTION, 2.0, threading.Event())
    taken = b.lock.acquire(ELECTION, "b", 3.0, 0)
    assert taken.term is not None
    assert b.lock.renew(ELECTION, taken.term, 3.0)[0] is Renewal.RENEWED
    assert b.records.claim(Fence(ELECTION, taken.term), [Write("slot", None, "1")]) == [True]


@pytest.mark.timing  # bounds the lock's release to half a second
@pytest.mark.parametrize("ttl", [1.0, 1.4])
def test_wait_timeout_frees_the_lock_no_earlier_than_the_belief(
    stores: Callable[..., StoreFacets], ttl: float
) -> None:
    a, b = stores(), stores()
    sent = time.monotonic()
    term = a.lock.acquire(ELECTION, "a", ttl, 0).term  # and never renewed: a "paused" holder
    assert term is not None
    assert b.lock.acquire(ELECTION, "b", ttl, 0).term is None
    b.lock.wait(ELECTION, ttl + 3, threading.Event())
    taken = b.lock.acquire(ELECTION, "b", ttl, 0)
    won = time.monotonic()
    assert taken.term is not None
    # The holder's belief (what Lease trusts after `sent`) ended before b won...
    assert won > sent + ttl * (1 - DRIFT) - MARGIN
    # ...and the server kept the lock no longer than the ttl rounded up to whole seconds.
    assert won - sent < -(-ttl // 1) + 0.5
    assert a.records.claim(Fence(ELECTION, term), [Write("slot", None, "stale")]) == [False]
    assert a.lock.renew(ELECTION, term, ttl)[0] is Renewal.LOST


def test_a_renewing_holder_outlives_wait_timeout(stores: Callable[..., StoreFacets]) -> None:
    a = stores()
    term = a.lock.acquire(ELECTION, "a", 1.0, 0).term
    assert term is not None
    until = time.monotonic() + 2.5
    while time.monotonic() < until:
        assert a.lock.renew(ELECTION, term, 1.0)[0] is Renewal.RENEWED
        time.sleep(0.3)  # the renew interval of a 1 s ttl
    assert a.records.claim(Fence(ELECTION, term), [Write("slot", None, "1")]) == [True]


@pytest.mark.timing  # within 0.3 s of the store deadline, 0.5 s of the ttl
def test_a_cut_off_holder_loses_its_claims_and_a_follower_takes_over_after_the_ttl(
    mariadb_server: MariaDbServer,
    stores: Callable[..., StoreFacets],
    tcp_proxy: Callable[[str, int], TcpProxy],
) -> None:
    proxy = tcp_proxy("127.0.0.1", mariadb_server.port)
    a, b = stores(proxy.url_for(mariadb_server.url)), stores()
    sent = time.monotonic()
    term = a.lock.acquire(ELECTION, "a", 1.0, 0).term
    assert term is not None
    proxy.hold()
    began = time.monotonic()
    assert a.records.claim(Fence(ELECTION, term), [Write("slot", None, "cut")]) == [False]
    assert time.monotonic() - began < 0.5 + 0.3  # the store deadline, not longer
    assert b.lock.acquire(ELECTION, "b", 1.0, 0).term is None
    b.lock.wait(ELECTION, 5.0, threading.Event())
    taken = b.lock.acquire(ELECTION, "b", 1.0, 0)
    assert taken.term is not None
    # The server counts wait_timeout from its answer to the holder's last statement: the
    # follower takes over after it, and before a second one (whole seconds on MariaDB)
    # would have passed. Measured from ``sent``: 1.14 to 1.19 s alone, 1.31 to 1.53 s
    # beside three busy loops, 1.72 s once in the timing stream of a full run.
    assert sent + 1.0 * (1 - DRIFT) - MARGIN < time.monotonic() < sent + 2.0
    proxy.release()
    assert a.lock.renew(ELECTION, term, 1.0)[0] is Renewal.LOST
    assert b.records.load(ELECTION) == {}


def test_errors_are_one_line_with_the_password_masked(mariadb_server: MariaDbServer) -> None:
    url = f"mariadb://leader:s3cret-pw@127.0.0.1:{mariadb_server.port}/leader"
    store = open_store(StoreParams(url, PREFIX, 0.5))
    with pytest.raises(StoreUnavailable) as info:
        store.lock.acquire(ELECTION, "a", 5.0, 0)
    message = str(info.value)
    assert "s3cret-pw" not in message and "\n" not in message
    assert "Access denied" in message and "leader:***@" in message


def test_a_galera_node_is_refused_in_one_line() -> None:
    # wsrep on without a provider: the server says it is a Galera node, alone.
    with MariaDbServer("--wsrep-on=ON", "--wsrep-provider=none", "--binlog-format=ROW") as node:
        store = open_store(StoreParams(node.url, PREFIX, 0.5))
        with pytest.raises(StoreMisconfigured) as info:
            store.lock.acquire(ELECTION, "a", 5.0, 0)
    message = str(info.value)
    assert "\n" not in message and "Galera" in message and "not replicated" in message


def test_the_store_clock_is_utc_whatever_the_session_time_zone(
    mariadb_server: MariaDbServer, stores: Callable[..., StoreFacets]
) -> None:
    """Acquire, renew and the probe read the server's clock as seconds since the Unix
    epoch, also when the server's time_zone is not UTC (NOW() would be 5 h off here)."""
    with mariadb_server.root_connection() as conn, conn.cursor() as cur:
        cur.execute("SET GLOBAL time_zone = '+05:00'")
    try:
        a = stores()
        won = a.lock.acquire(ELECTION, "a", 5.0, 0)
        assert won.term is not None
        renewal, renewed_at = a.lock.renew(ELECTION, won.term, 5.0)
        assert renewal is Renewal.RENEWED
        for when in (won.store_time, renewed_at, a.lock.store_time(ELECTION)):
            assert when is not None and abs(when - time.time()) < 1.0
    finally:
        with mariadb_server.root_connection() as conn, conn.cursor() as cur:
            cur.execute("SET GLOBAL time_zone = 'SYSTEM'")


def test_explicit_replica_acks_are_refused(stores: Callable[..., StoreFacets]) -> None:
    a = stores(acks=1)
    term = a.lock.acquire(ELECTION, "a", 5.0, 0).term
    assert term is not None
    with pytest.raises(StoreMisconfigured, match="leader_replica_acks is 1"):
        a.records.claim(Fence(ELECTION, term), [Write("slot", None, "1")])
    assert a.records.load(ELECTION) == {}


def test_url_parameters() -> None:
    params, target = connection_params(
        "mysql://u:p%40w@db.example:3307/app?ssl_ca=/ca.pem&ssl_verify_identity=true"
    )
    assert params == {
        "host": "db.example",
        "port": 3307,
        "database": "app",
        "user": "u",
        "password": "p@w",
        "ssl_ca": "/ca.pem",
        "ssl_verify_identity": True,
    }
    assert target == "mysql://u:***@db.example:3307/app?ssl_ca=/ca.pem&ssl_verify_identity=true"
    with pytest.raises(ConfigError, match="names no database"):
        connection_params("mariadb://u:p@host/")
    with pytest.raises(ConfigError, match="unknown or invalid query parameter sslmode"):
        connection_params("mariadb://u:p@host/db?sslmode=require")


def test_django_alias_selects_the_store_by_engine(mariadb_url: str, procs: Procs) -> None:
    parts = urlsplit(mariadb_url)
    code = textwrap.dedent(
        f"""
        import django
        from django.conf import settings
        settings.configure(DATABASES={{
            "default": {{
                "ENGINE": "django.db.backends.mysql",
                "NAME": {parts.path.lstrip("/")!r}, "USER": {parts.username!r},
                "PASSWORD": {parts.password!r}, "HOST": {parts.hostname!r},
                "PORT": {str(parts.port)!r}, "OPTIONS": {{"charset": "utf8mb4"}},
            }},
            "pg": {{"ENGINE": "django.db.backends.postgresql", "NAME": "x"}},
        }})
        django.setup()
        from celery_leader.backends import open_store
        from celery_leader.settings.config import LeaderConfig

        for alias in ("default", "pg"):
            config = LeaderConfig.from_mapping({{"leader_url": f"django://{{alias}}"}})
            print("KIND", alias, config.store_kind)
        store = open_store(LeaderConfig.from_mapping({{"leader_url": "django://default"}}))
        print("EPOCH", store.lock.acquire("beat", "a", 5.0, 0).term.epoch)
        print("TARGET", store.lock._db.target)
        """
    )
    proc = procs.spawn_python(code)
    assert proc.wait(30) == 0, proc.output()
    lines = proc.lines()
    assert "KIND default mysql" in lines and "KIND pg postgres" in lines, proc.output()
    assert "EPOCH 1" in lines, proc.output()
    target = f"TARGET django://default (database {parts.path.lstrip('/')!r} on {parts.hostname})"
    assert target in lines, proc.output()
