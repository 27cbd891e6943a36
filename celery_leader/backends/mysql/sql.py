"""The SQL of the MySQL / MariaDB store, and the ``GET_LOCK`` name of an election.

Values travel as parameters (the S608 waivers splice in constants only). Only
statements both MySQL >= 8.0 and MariaDB >= 10.4 run: no ``RETURNING``, no
``INSERT ... AS new``; the epoch comes back through ``LAST_INSERT_ID(expr)``.
"""

from __future__ import annotations

import hashlib
import math

#: ``GET_LOCK`` names longer than this are refused by MySQL (ER_USER_LOCK_WRONG_NAME).
MAX_LOCK_NAME = 64

#: Starts every hashed lock name. Key prefixes and election names cannot
#: contain ``#`` (config checks them), so no readable name starts with it.
HASHED = "celery_leader#"


def lock_name(database: str, key_prefix: str, election: str) -> str:
    """The ``GET_LOCK`` name of ``election``: ``"<prefix>:<election>@<database>"``.

    Named locks are server-wide, hence the database. Names over 64 characters become
    ``"celery_leader#"`` + the first 50 hex digits of their SHA-256."""
    name = f"{key_prefix}:{election}@{database}"
    if len(name) <= MAX_LOCK_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()
    return HASHED + digest[: MAX_LOCK_NAME - len(HASHED)]


def whole_seconds(seconds: float) -> int:
    """A timeout the server takes in whole seconds, rounded up so it never shrinks."""
    return max(1, math.ceil(seconds))


#: Serializes table creation between processes (a named lock of its own:
#: ``#`` keeps it apart from every election's name).
SCHEMA_LOCK = "celery_leader#schema"

SCHEMA_EXISTS = """
SELECT COUNT(*) = 9 FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name IN (
    'celery_leader_lease', 'celery_leader_state', 'celery_leader_runs',
    'celery_leader_entries', 'celery_leader_entries_version',
    'celery_leader_run_records', 'celery_leader_run_entries', 'celery_leader_run_counts',
    'celery_leader_journal'
)
"""

# utf8mb4_bin: values and names compare byte for byte. The default collations
# ignore case and trailing spaces, which would let a compare-and-set match a
# state it did not read. A primary key holds 3072 bytes, 4 a character: the
# journal's log (an entry's is "audit/" and its name) and key fit beside the
# prefix and the election.
CREATE_SCHEMA = f"""
DO GET_LOCK('{SCHEMA_LOCK}', 10);
CREATE TABLE IF NOT EXISTS celery_leader_lease (
    prefix      VARCHAR(190) NOT NULL,
    election    VARCHAR(190) NOT NULL,
    lock_name   VARCHAR(64)  NOT NULL,
    epoch       BIGINT       NOT NULL,
    token       TEXT,
    instance_id TEXT,
    conn        BIGINT UNSIGNED,
    resign      TEXT,
    PRIMARY KEY (prefix, election)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS celery_leader_state (
    prefix   VARCHAR(190) NOT NULL,
    election VARCHAR(190) NOT NULL,
    entry    VARCHAR(190) NOT NULL,
    value    MEDIUMTEXT   NOT NULL,
    PRIMARY KEY (prefix, election, entry)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS celery_leader_runs (
    prefix   VARCHAR(190) NOT NULL,
    election VARCHAR(190) NOT NULL,
    run_key  VARCHAR(190) NOT NULL,
    value    MEDIUMTEXT   NOT NULL,
    expires  DOUBLE       NOT NULL,
    PRIMARY KEY (prefix, election, run_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS celery_leader_run_records (
    prefix   VARCHAR(190) NOT NULL,
    election VARCHAR(190) NOT NULL,
    entry    VARCHAR(190) NOT NULL,
    run_key  VARCHAR(190) NOT NULL,
    value    TEXT         NOT NULL,
    tally    VARCHAR(32)  NOT NULL,
    expires  DOUBLE       NOT NULL,
    created  DOUBLE       NOT NULL,
    PRIMARY KEY (prefix, election, entry, run_key),
    KEY celery_leader_run_records_expiry (prefix, election, entry, expires),
    KEY celery_leader_run_records_order (prefix, election, entry, created)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS celery_leader_run_entries (
    prefix   VARCHAR(190) NOT NULL,
    election VARCHAR(190) NOT NULL,
    entry    VARCHAR(190) NOT NULL,
    kept     BIGINT       NOT NULL,
    until    DOUBLE       NOT NULL,
    PRIMARY KEY (prefix, election, entry)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS celery_leader_run_counts (
    prefix   VARCHAR(190) NOT NULL,
    election VARCHAR(190) NOT NULL,
    entry    VARCHAR(190) NOT NULL,
    tally    VARCHAR(32)  NOT NULL,
    n        BIGINT       NOT NULL,
    PRIMARY KEY (prefix, election, entry, tally)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS celery_leader_entries (
    prefix   VARCHAR(190) NOT NULL,
    election VARCHAR(190) NOT NULL,
    name     VARCHAR(190) NOT NULL,
    value    MEDIUMTEXT   NOT NULL,
    PRIMARY KEY (prefix, election, name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS celery_leader_entries_version (
    prefix   VARCHAR(190) NOT NULL,
    election VARCHAR(190) NOT NULL,
    version  BIGINT       NOT NULL,
    PRIMARY KEY (prefix, election)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS celery_leader_journal (
    prefix   VARCHAR(190) NOT NULL,
    election VARCHAR(190) NOT NULL,
    log      VARCHAR(255) NOT NULL,
    log_key  VARCHAR(128) NOT NULL,
    data     MEDIUMTEXT   NOT NULL,
    PRIMARY KEY (prefix, election, log, log_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
DO RELEASE_LOCK('{SCHEMA_LOCK}')
"""

# Every connection; the last statement reports what the server is. The lock
# wait timeouts (whole seconds) keep a statement stuck behind another session's
# lock from waiting the default 50 s / 1 year: it fails, the session carries on.
SETUP = """
SET SESSION wait_timeout = COALESCE(%(idle_s)s, @@GLOBAL.wait_timeout),
            innodb_lock_wait_timeout = %(lock_wait_s)s,
            lock_wait_timeout = %(lock_wait_s)s,
            sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION';
SELECT CONNECTION_ID(), VERSION();
SHOW GLOBAL VARIABLES WHERE Variable_name IN
    ('wsrep_on', 'group_replication_group_name', 'group_replication_single_primary_mode')
"""


def statement_deadline(version: str, seconds: float | None) -> tuple[str, dict[str, float]]:
    """The statement (and its parameters) that has the server cancel this session's
    statements after ``seconds`` (``None``: never), by the server's ``VERSION()``:
    MariaDB's ``max_statement_time`` (seconds, every statement, its ``VERSION()`` says
    ``MariaDB``), MySQL's ``max_execution_time`` (milliseconds, ``SELECT`` only)."""
    # 0 is "no limit" for both.
    if "mariadb" in version.lower():
        limit = 0.0 if seconds is None else round(seconds, 3)
        return "SET SESSION max_statement_time = %(seconds)s", {"seconds": limit}
    return "SET SESSION max_execution_time = %(ms)s", {
        "ms": 0 if seconds is None else max(1, int(seconds * 1000))
    }


# The server's clock in microseconds since the Unix epoch, as the statement
# starts. UTC_TIMESTAMP(6) is UTC whatever the session's time_zone;
# UNIX_TIMESTAMP(NOW(6)) is ambiguous for the hour daylight saving time falls back.
NOW_US = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
CLOCK = f"SELECT {NOW_US}"

LEASE_ROW = (
    "SELECT instance_id, epoch, token FROM celery_leader_lease"
    " WHERE prefix = %(prefix)s AND election = %(election)s"
)

TRY_LOCK = f"""
SELECT CONNECTION_ID(), GET_LOCK(%(lock)s, 0), t.instance_id, t.epoch, t.token, {NOW_US}
FROM (SELECT 1) AS one LEFT JOIN ({LEASE_ROW}) AS t ON TRUE
"""  # noqa: S608

# The server's clock in seconds since the epoch, for the term's start.
SINCE = f"{NOW_US} / 1000000"

# On the session that holds the lock, so no two processes bump one election's
# epoch at once. The term's JSON says since when it holds (0.4.0 tables serve).
START_TERM = f"""
INSERT INTO celery_leader_lease (prefix, election, lock_name, epoch, instance_id, conn)
VALUES (%(prefix)s, %(election)s, %(lock)s, LAST_INSERT_ID(%(floor)s + 1), %(instance)s,
        CONNECTION_ID())
ON DUPLICATE KEY UPDATE
    epoch = LAST_INSERT_ID(GREATEST(epoch, %(floor)s) + 1),
    lock_name = %(lock)s, instance_id = %(instance)s, conn = CONNECTION_ID(), resign = NULL;
UPDATE celery_leader_lease
SET token = JSON_OBJECT('token', %(nonce)s, 'epoch', LAST_INSERT_ID(), 'holder', %(instance)s,
                        'since', {SINCE})
WHERE prefix = %(prefix)s AND election = %(election)s;
SELECT CONNECTION_ID(), epoch, token, {NOW_US} FROM celery_leader_lease
WHERE prefix = %(prefix)s AND election = %(election)s
"""  # noqa: S608

# The renewal: a ping with the store deadline that also says whether this
# session still holds the lock and whether an operator asked it to resign.
RENEW = f"""
SELECT CONNECTION_ID(), IS_USED_LOCK(%(lock)s) <=> CONNECTION_ID(),
       EXISTS (SELECT 1 FROM celery_leader_lease
               WHERE prefix = %(prefix)s AND election = %(election)s AND resign = %(token)s),
       {NOW_US}
"""  # noqa: S608

RELEASE = "SELECT RELEASE_LOCK(%(lock)s)"

# A queued follower's slice: GET_LOCK returns 1 the moment the holder releases
# the lock or its session ends, 0 at the end of the slice (then it queues again).
WAIT_LOCK = "SELECT GET_LOCK(%(lock)s, %(slice_s)s)"

HOLDER = """
SELECT IS_USED_LOCK(%(lock)s), t.instance_id, t.epoch, t.token, t.conn
FROM (SELECT 1) AS one
LEFT JOIN celery_leader_lease AS t ON t.prefix = %(prefix)s AND t.election = %(election)s
"""

REQUEST_RESIGN = """
UPDATE celery_leader_lease SET resign = token
WHERE prefix = %(prefix)s AND election = %(election)s AND conn = IS_USED_LOCK(%(lock)s);
SELECT instance_id, epoch, token FROM celery_leader_lease
WHERE prefix = %(prefix)s AND election = %(election)s AND conn = IS_USED_LOCK(%(lock)s)
  AND resign = token
"""

# Fenced writes, each only while this session holds the lock. Connections report
# *matched* rows (CLIENT.FOUND_ROWS): a write of the value expected still applies.
CLAIM_NEW = """
INSERT INTO celery_leader_state (prefix, election, entry, value)
SELECT %(prefix)s, %(election)s, %(entry)s, %(new)s FROM DUAL
WHERE IS_USED_LOCK(%(lock)s) <=> CONNECTION_ID()
  AND NOT EXISTS (SELECT 1 FROM celery_leader_state
                  WHERE prefix = %(prefix)s AND election = %(election)s AND entry = %(entry)s)
"""
CLAIM_UPDATE = """
UPDATE celery_leader_state SET value = %(new)s
WHERE prefix = %(prefix)s AND election = %(election)s AND entry = %(entry)s
  AND value = %(expected)s AND IS_USED_LOCK(%(lock)s) <=> CONNECTION_ID()
"""


# The run ledger's marks: any process's, so no lock is checked; an expired record
# counts as absent. Then a read of what is stored says whether the write won
# (records name their writer's pid and start time, so two are never equal).
_RUN_NOW = "UNIX_TIMESTAMP(NOW(6))"

# Assignments apply left to right: ``value`` changes only where the stored
# record had expired, and ``expires`` follows it exactly where it changed.
PUT_RUN_NEW = f"""
INSERT INTO celery_leader_runs (prefix, election, run_key, value, expires)
VALUES (%(prefix)s, %(election)s, %(key)s, %(new)s, {_RUN_NOW} + %(ttl)s)
ON DUPLICATE KEY UPDATE
    value = IF(expires <= {_RUN_NOW}, VALUES(value), value),
    expires = IF(value = VALUES(value), VALUES(expires), expires)
"""  # noqa: S608

PUT_RUN_REPLACE = f"""
UPDATE celery_leader_runs SET value = %(new)s, expires = {_RUN_NOW} + %(ttl)s
WHERE prefix = %(prefix)s AND election = %(election)s AND run_key = %(key)s
  AND value = %(expected)s AND expires > {_RUN_NOW}
"""  # noqa: S608

GET_RUN = f"""
SELECT value FROM celery_leader_runs
WHERE prefix = %(prefix)s AND election = %(election)s AND run_key = %(key)s
  AND expires > {_RUN_NOW}
"""  # noqa: S608

# Expired marks go when a worker writes: at most 100 a time, bounded work (the
# previous release's slots, kept here, drain with them).
SWEEP_RUNS = f"""
DELETE FROM celery_leader_runs
WHERE prefix = %(prefix)s AND election = %(election)s AND expires <= {_RUN_NOW}
  AND run_key <> %(key)s
LIMIT 100
"""  # noqa: S608

_ENTRY = "prefix = %(prefix)s AND election = %(election)s AND entry = %(entry)s"
_RECORD = f"{_ENTRY} AND run_key = %(key)s"
_LEGACY = "prefix = %(prefix)s AND election = %(election)s AND run_key = %(key)s"
# The entry's first records by ``{by}`` (an index each), ``{count}`` of them at most.
_OLDEST = """
    SELECT run_key FROM (
        SELECT run_key, ROW_NUMBER() OVER (ORDER BY {by}, run_key) AS n
        FROM (SELECT run_key, {by} FROM celery_leader_run_records
              WHERE {where} ORDER BY {by}, run_key LIMIT %(most)s) AS o) AS r
    WHERE n <= {count}"""

# An entry's run record, one transaction in one round trip. The entry's row is
# locked first: its writers take turns, so what decides stays true until the
# commit. A previous release's record in celery_leader_runs is moved here when
# replaced. Dropped rows are joined by primary key (a subquery "IN" made MariaDB
# scan the entry's rows).
PUT_ENTRY_RUN = f"""
START TRANSACTION;
INSERT INTO celery_leader_run_entries (prefix, election, entry, kept, until)
VALUES (%(prefix)s, %(election)s, %(entry)s, 0, 0) ON DUPLICATE KEY UPDATE kept = kept;
SET @now = {_RUN_NOW}, @cur = NULL, @live = 0, @old = NULL, @legacy = NULL;
SELECT value, expires > @now, tally INTO @cur, @live, @old
FROM celery_leader_run_records WHERE {_RECORD} FOR UPDATE;
SET @cur = IF(@live, @cur, NULL);
SELECT value INTO @legacy FROM celery_leader_runs
WHERE {_LEGACY} AND expires > @now AND @cur IS NULL FOR UPDATE;
SET @cur = COALESCE(@cur, @legacy);
SET @ok = @cur <=> %(expected)s;
SET @added = @ok AND @old IS NULL;
INSERT INTO celery_leader_run_records
    (prefix, election, entry, run_key, value, tally, expires, created)
SELECT %(prefix)s, %(election)s, %(entry)s, %(key)s, %(new)s, %(tally)s, @now + %(ttl)s, @now
FROM DUAL WHERE @ok
ON DUPLICATE KEY UPDATE value = VALUES(value), tally = VALUES(tally), expires = VALUES(expires),
    created = IF(@live, created, VALUES(created));
DELETE FROM celery_leader_runs WHERE {_LEGACY} AND @ok AND @legacy IS NOT NULL;
INSERT INTO celery_leader_run_counts (prefix, election, entry, tally, n)
SELECT %(prefix)s, %(election)s, %(entry)s, %(tally)s, 1 FROM DUAL WHERE @ok AND %(tally)s <> ''
ON DUPLICATE KEY UPDATE n = n + 1;
UPDATE celery_leader_run_counts SET n = n - 1 WHERE {_ENTRY} AND tally = @old AND @ok;
CREATE TEMPORARY TABLE IF NOT EXISTS celery_leader_dropped (
    run_key VARCHAR(190) NOT NULL PRIMARY KEY
) ENGINE = MEMORY DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
DELETE FROM celery_leader_dropped;
SELECT kept + @added INTO @kept FROM celery_leader_run_entries WHERE {_ENTRY};
INSERT INTO celery_leader_dropped (run_key)
{_OLDEST.format(
    by="expires",
    where=_ENTRY + " AND run_key <> %(key)s AND expires <= @now AND @ok",
    count="%(most)s",
)};
SET @kept = @kept - ROW_COUNT();
INSERT IGNORE INTO celery_leader_dropped (run_key)
{_OLDEST.format(
    by="created",
    where=_ENTRY + " AND run_key <> %(key)s AND expires > @now AND @ok AND %(keep)s > 0",
    count="@kept - %(keep)s",
)};
UPDATE celery_leader_run_counts AS c JOIN (
    SELECT r.tally, COUNT(*) AS n FROM celery_leader_dropped AS d
    JOIN celery_leader_run_records AS r ON r.prefix = %(prefix)s
        AND r.election = %(election)s AND r.entry = %(entry)s AND r.run_key = d.run_key
    GROUP BY r.tally) AS g ON c.tally = g.tally
SET c.n = c.n - g.n WHERE c.prefix = %(prefix)s AND c.election = %(election)s
  AND c.entry = %(entry)s;
DELETE r FROM celery_leader_run_records AS r
JOIN celery_leader_dropped AS d ON r.run_key = d.run_key
WHERE r.prefix = %(prefix)s AND r.election = %(election)s AND r.entry = %(entry)s;
UPDATE celery_leader_run_entries
SET kept = kept + @added - ROW_COUNT(), until = GREATEST(until, @now + %(ttl)s)
WHERE {_ENTRY} AND @ok;
COMMIT;
SELECT @ok, @cur
"""  # noqa: S608

# The newest created first, by the order index; ``limit`` bounded by the caller.
RUNS_OF = f"""
SELECT run_key, value FROM celery_leader_run_records
WHERE {_ENTRY} AND expires > {_RUN_NOW}
ORDER BY created DESC LIMIT %(limit)s
"""  # noqa: S608

# A page of entries after ``after`` (by name): each one's greatest live key (a
# backward scan of the primary key), its record, and its counts as JSON.
RUN_SUMMARIES = f"""
SELECT e.entry,
    (SELECT r.run_key FROM celery_leader_run_records AS r
     WHERE r.prefix = e.prefix AND r.election = e.election AND r.entry = e.entry
       AND r.expires > {_RUN_NOW} ORDER BY r.run_key DESC LIMIT 1) AS last_key,
    (SELECT COALESCE(JSON_OBJECTAGG(c.tally, c.n), '{{}}') FROM celery_leader_run_counts AS c
     WHERE c.prefix = e.prefix AND c.election = e.election AND c.entry = e.entry
       AND c.n <> 0) AS counts
FROM celery_leader_run_entries AS e
WHERE e.prefix = %(prefix)s AND e.election = %(election)s AND e.entry > %(after)s
  AND e.until > {_RUN_NOW}
ORDER BY e.entry LIMIT %(page)s
"""  # noqa: S608

# The records of the keys a summary page named.
RUN_RECORDS = """
SELECT entry, run_key, value FROM celery_leader_run_records
WHERE prefix = %(prefix)s AND election = %(election)s AND (entry, run_key) IN %(keys)s
"""

# The fenced records of some keys (a chunk of them: see sql_facets.STATE_KEYS).
STATE_OF = """
SELECT entry, value FROM celery_leader_state
WHERE prefix = %(prefix)s AND election = %(election)s AND entry IN %(keys)s
"""


# Journal writes, in one transaction and one round trip: per round (see
# :func:`~..journal.journal_rounds`: each log has one ``keep``) one INSERT of
# its records (a key written twice keeps the last), then per log of the round
# its ``keep``-th greatest key (a backward scan of the primary key, ``keep``
# rows at most) and a delete of the keys below it (a range of the primary key,
# as many rows as fall out). The floor goes through a variable: MySQL refuses
# a DELETE whose subquery reads its own table.
JOURNAL_ROW = "(%(prefix)s, %(election)s, %(log{i})s, %(key{i})s, %(data{i})s)"
PUT_JOURNAL = """
INSERT INTO celery_leader_journal (prefix, election, log, log_key, data) VALUES {rows}
ON DUPLICATE KEY UPDATE data = VALUES(data)
"""
_LOG_I = "prefix = %(prefix)s AND election = %(election)s AND log = %(log{i})s"
JOURNAL_FLOOR = f"""
SELECT log_key FROM celery_leader_journal WHERE {_LOG_I}
ORDER BY log_key DESC LIMIT 1 OFFSET %(skip{{i}})s
"""  # noqa: S608
JOURNAL_DROP = f"""
DELETE FROM celery_leader_journal WHERE {_LOG_I} AND log_key < @celery_leader_floor
"""  # noqa: S608
TRIM_JOURNAL = f"SET @celery_leader_floor = ({JOURNAL_FLOOR.strip()});\n{JOURNAL_DROP.strip()}"
