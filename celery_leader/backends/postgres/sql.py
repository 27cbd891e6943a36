"""The SQL of the PostgreSQL store, and the advisory-lock key of an election.

Values travel as parameters (the S608 waivers splice in constants only).
"""

from __future__ import annotations

import hashlib
import math

#: ``idle_session_timeout`` appeared in PostgreSQL 14.
MIN_SERVER_VERSION = 140000

#: How often a queued follower's server process checks that its client is
#: still there (``client_connection_check_interval``), so that a dead
#: follower leaves the lock queue instead of being granted the lock first.
CLIENT_CHECK_MS = "1000"


def advisory_key(key_prefix: str, election: str) -> int:
    """The advisory-lock key of ``election``: SHA-256 of ``prefix:election``, 8 bytes, signed."""
    digest = hashlib.sha256(f"{key_prefix}:{election}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def lock_ids(key: int) -> dict[str, int]:
    """``pg_locks`` shows a ``bigint`` advisory key split in two unsigned halves."""
    return {"classid": (key >> 32) & 0xFFFFFFFF, "objid": key & 0xFFFFFFFF}


#: Serializes table creation between processes. The space keeps it apart from
#: every election key: election names and key prefixes cannot contain one.
SCHEMA_KEY = advisory_key("celery_leader", "schema ddl")

SCHEMA_EXISTS = (
    "SELECT to_regclass('celery_leader_lease') IS NOT NULL"
    " AND to_regclass('celery_leader_state') IS NOT NULL"
    " AND to_regclass('celery_leader_runs') IS NOT NULL"
    " AND to_regclass('celery_leader_entries') IS NOT NULL"
    " AND to_regclass('celery_leader_run_records_order') IS NOT NULL"
    " AND to_regclass('celery_leader_run_entries') IS NOT NULL"
    " AND to_regclass('celery_leader_journal') IS NOT NULL"
)

# Sent as one simple-protocol query: one round trip, one implicit transaction,
# so the transaction-level advisory lock covers both statements. Checking
# SCHEMA_EXISTS first lets a role without CREATE use tables an admin made.
CREATE_SCHEMA = f"""
SELECT pg_advisory_xact_lock({SCHEMA_KEY});
CREATE TABLE IF NOT EXISTS celery_leader_lease (
    prefix      text    NOT NULL,
    election    text    NOT NULL,
    epoch       bigint  NOT NULL,
    token       text,
    instance_id text,
    pid         integer,
    resign      text,
    PRIMARY KEY (prefix, election)
);
CREATE TABLE IF NOT EXISTS celery_leader_state (
    prefix   text NOT NULL,
    election text NOT NULL,
    entry    text NOT NULL,
    value    text NOT NULL,
    PRIMARY KEY (prefix, election, entry)
);
CREATE TABLE IF NOT EXISTS celery_leader_runs (
    prefix   text   NOT NULL,
    election text   NOT NULL,
    key      text   NOT NULL,
    value    text   NOT NULL,
    expires  float8 NOT NULL,
    PRIMARY KEY (prefix, election, key)
);
CREATE TABLE IF NOT EXISTS celery_leader_run_records (
    prefix   text   NOT NULL,
    election text   NOT NULL,
    entry    text   NOT NULL,
    key      text   NOT NULL,
    value    text   NOT NULL,
    tally    text   NOT NULL,
    expires  float8 NOT NULL,
    created  float8 NOT NULL,
    PRIMARY KEY (prefix, election, entry, key)
);
CREATE INDEX IF NOT EXISTS celery_leader_run_records_expiry
    ON celery_leader_run_records (prefix, election, entry, expires);
CREATE INDEX IF NOT EXISTS celery_leader_run_records_order
    ON celery_leader_run_records (prefix, election, entry, created);
CREATE INDEX IF NOT EXISTS celery_leader_run_records_stale
    ON celery_leader_run_records (prefix, election, expires);
CREATE TABLE IF NOT EXISTS celery_leader_run_entries (
    prefix   text   NOT NULL,
    election text   NOT NULL,
    entry    text   NOT NULL,
    kept     bigint NOT NULL,
    counts   jsonb  NOT NULL,
    until    float8 NOT NULL,
    PRIMARY KEY (prefix, election, entry)
);
CREATE TABLE IF NOT EXISTS celery_leader_entries (
    prefix   text NOT NULL,
    election text NOT NULL,
    name     text NOT NULL,
    value    text NOT NULL,
    PRIMARY KEY (prefix, election, name)
);
CREATE TABLE IF NOT EXISTS celery_leader_entries_version (
    prefix   text   NOT NULL,
    election text   NOT NULL,
    version  bigint NOT NULL,
    PRIMARY KEY (prefix, election)
);
CREATE TABLE IF NOT EXISTS celery_leader_journal (
    prefix   text NOT NULL,
    election text NOT NULL,
    log      text NOT NULL,
    log_key  text COLLATE "C" NOT NULL,
    data     text NOT NULL,
    PRIMARY KEY (prefix, election, log, log_key)
)
"""

# Every connection: the pid identifies the server session. synchronous_commit:
# a claim or epoch bump the server confirmed must survive a crash and reach the
# synchronous standbys, so ``off`` and ``local`` get ``on`` back for our sessions.
SETUP = """
SELECT pg_backend_pid(),
       set_config('statement_timeout', %(statement_ms)s, false),
       set_config('idle_session_timeout', %(idle_ms)s, false),
       set_config('idle_in_transaction_session_timeout', %(idle_ms)s, false),
       set_config('synchronous_commit',
                  CASE WHEN current_setting('synchronous_commit') IN ('off', 'local') THEN 'on'
                       ELSE current_setting('synchronous_commit') END,
                  false)
"""

# The server's clock as the statement runs (seconds since the epoch):
# clock_timestamp(), not now(), which is the transaction's start.
NOW = "extract(epoch FROM clock_timestamp())::float8"
CLOCK = f"SELECT {NOW}"

TRY_LOCK = f"""
SELECT pg_backend_pid(), pg_try_advisory_lock(%(key)s::bigint), t.instance_id, t.epoch,
       t.token, {NOW}
FROM (VALUES (1)) AS one (x)
LEFT JOIN celery_leader_lease AS t ON t.prefix = %(prefix)s AND t.election = %(election)s
"""  # noqa: S608

# On the session that holds the lock, so no two processes bump one election's
# epoch at once. The term's JSON says since when it holds (0.4.0 tables serve).
START_TERM = f"""
INSERT INTO celery_leader_lease AS t (prefix, election, epoch, token, instance_id, pid)
VALUES (
    %(prefix)s, %(election)s, %(floor)s::bigint + 1,
    jsonb_build_object('token', %(nonce)s::text, 'epoch', %(floor)s::bigint + 1,
                       'holder', %(instance)s::text, 'since', {NOW})::text,
    %(instance)s, pg_backend_pid()
)
ON CONFLICT (prefix, election) DO UPDATE SET
    epoch = GREATEST(t.epoch, %(floor)s::bigint) + 1,
    token = jsonb_build_object('token', %(nonce)s::text,
                               'epoch', GREATEST(t.epoch, %(floor)s::bigint) + 1,
                               'holder', %(instance)s::text, 'since', {NOW})::text,
    instance_id = EXCLUDED.instance_id,
    pid = EXCLUDED.pid,
    resign = NULL
RETURNING pg_backend_pid(), epoch, token, {NOW}
"""  # noqa: S608

# "This session holds the election's lock", for statements on the holder's session.
I_HOLD = """
    SELECT FROM pg_locks
    WHERE locktype = 'advisory' AND pid = pg_backend_pid()
      AND classid = %(classid)s::oid AND objid = %(objid)s::oid AND objsubid = 1 AND granted
"""

RENEW = f"""
SELECT pg_backend_pid(),
       set_config('idle_session_timeout', %(idle_ms)s, false),
       EXISTS ({I_HOLD}),
       EXISTS (SELECT FROM celery_leader_lease
               WHERE prefix = %(prefix)s AND election = %(election)s AND resign = %(token)s),
       {NOW}
"""  # noqa: S608

RELEASE = "SELECT pg_advisory_unlock(%(key)s::bigint)"


def sync_standbys(names: str) -> str:
    """SQL: how many standbys each commit waits for, by ``names`` (SQL text of a
    ``synchronous_standby_names`` value): "FIRST n (...)", "ANY n (...)" and "n (...)"
    wait for n, a plain list (or "*") for one, an empty one for none."""
    return rf"""
CASE WHEN btrim({names}) = '' THEN 0
     ELSE coalesce((regexp_match({names}, '^\s*(?:(?:first|any)\s+)?(\d+)\s*\(', 'i'))[1]::int,
                   1)
END
"""


# Physical standbys connected now. Any role sees the rows of pg_stat_replication
# (not their details); a logical walsender is the one using a logical slot.
STANDBYS = """
(SELECT count(*)::int FROM pg_stat_replication AS r
 WHERE NOT EXISTS (SELECT FROM pg_replication_slots AS s
                   WHERE s.slot_type = 'logical' AND s.active_pid = r.pid))
"""

# A claim writes its entries one by one, each by the primary key, so a batch
# costs the same at any number of entries. One statement that joined the claims
# to the table was planned from the table's statistics: on a young table, or on
# the generic plan the server picks once psycopg has prepared the statement
# (after five runs), it compared every claim with every row of the election, and
# a batch of 1,000 over 10,000 entries took seconds. Nothing is written unless
# ``held``: the fence, which the claim statement computes.
CLAIM_READY = (
    "SELECT to_regprocedure("
    "'celery_leader_claim(text, text, boolean, text[], text[], text[])') IS NOT NULL"
)
ADD_CLAIM = f"""
SELECT pg_advisory_xact_lock({SCHEMA_KEY});
CREATE OR REPLACE FUNCTION celery_leader_claim(
    claim_prefix text, claim_election text, held boolean,
    entries text[], expected text[], claimed text[]
) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    IF held IS NOT TRUE THEN
        RETURN;
    END IF;
    FOR c IN SELECT * FROM unnest(entries, expected, claimed) AS u (entry, expected, claimed)
    LOOP
        IF c.expected IS NULL THEN
            INSERT INTO celery_leader_state (prefix, election, entry, value)
            VALUES (claim_prefix, claim_election, c.entry, c.claimed)
            ON CONFLICT (prefix, election, entry) DO NOTHING;
        ELSE
            UPDATE celery_leader_state SET value = c.claimed
            WHERE prefix = claim_prefix AND election = claim_election
              AND entry = c.entry AND value = c.expected;
        END IF;
        IF FOUND THEN
            RETURN NEXT c.entry;
        END IF;
    END LOOP;
END
$$
"""  # noqa: S608

# The claims of one round name distinct entries, so their order does not matter.
# Nothing is claimed unless this session holds the election's lock and the
# commit waits for as many standbys as %(replica_acks)s asks (-1, "auto": one
# when any is connected). One more row, with a NULL entry, says how many are
# connected, waited for, and needed.
CLAIM = f"""
WITH replicas AS (
    SELECT standbys, sync, CASE WHEN %(replica_acks)s::int < 0 THEN LEAST(standbys, 1)
                                ELSE %(replica_acks)s::int END AS needed
    FROM (SELECT {STANDBYS} AS standbys,
                 {sync_standbys("current_setting('synchronous_standby_names')")} AS sync) AS r
), fence AS (
    SELECT EXISTS ({I_HOLD}) AND (SELECT sync >= needed FROM replicas) AS held
)
SELECT c.entry, NULL::int, NULL::int, NULL::int
FROM fence CROSS JOIN LATERAL celery_leader_claim(
    %(prefix)s, %(election)s, fence.held,
    %(entries)s::text[], %(expected)s::text[], %(new)s::text[]
) AS c (entry)
UNION ALL SELECT NULL, standbys, sync, needed FROM replicas
"""  # noqa: S608

# Hands back claims whose commit was cancelled while it waited for the standbys.
# Its own commit does not wait for them: should a promotion undo the hand-back,
# the claims stay, and their slots are skipped, never sent twice.
UNCLAIM = f"""
WITH back AS (
    SELECT * FROM unnest(%(entries)s::text[], %(claimed)s::text[], %(previous)s::text[])
        AS b (entry, claimed, previous)
    WHERE EXISTS ({I_HOLD}) AND set_config('synchronous_commit', 'local', true) IS NOT NULL
), restored AS (
    UPDATE celery_leader_state AS s SET value = back.previous
    FROM back
    WHERE s.prefix = %(prefix)s AND s.election = %(election)s
      AND s.entry = back.entry AND s.value = back.claimed AND back.previous IS NOT NULL
    RETURNING s.entry
), removed AS (
    DELETE FROM celery_leader_state AS s
    USING back
    WHERE s.prefix = %(prefix)s AND s.election = %(election)s
      AND s.entry = back.entry AND s.value = back.claimed AND back.previous IS NULL
    RETURNING s.entry
)
SELECT entry FROM restored UNION ALL SELECT entry FROM removed
"""  # noqa: S608

# A queued follower: no statement deadline for the lock wait itself, but a
# lock_timeout slice, because a waiting statement holds a snapshot and would
# hold back VACUUM's horizon for as long as it waits.
WAIT_SETUP = """
SELECT set_config('statement_timeout', '0', false),
       set_config('lock_timeout', %(slice_ms)s, false),
       set_config('client_connection_check_interval', %(check_ms)s, false)
"""
WAIT_LOCK = "SELECT pg_advisory_lock(%(key)s::bigint)"
WAIT_DONE = """
SELECT set_config('statement_timeout', %(statement_ms)s, false),
       set_config('lock_timeout', '0', false),
       set_config('client_connection_check_interval', '0', false)
"""

# Whoever holds the election's lock in this database, from any connection.
LOCKED_BY = """
    l.locktype = 'advisory'
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND l.classid = %(classid)s::oid AND l.objid = %(objid)s::oid AND l.objsubid = 1
    AND l.granted
"""

HOLDER = f"""
SELECT t.instance_id, t.epoch, t.token, t.pid IS NOT DISTINCT FROM l.pid
FROM pg_locks AS l
LEFT JOIN celery_leader_lease AS t ON t.prefix = %(prefix)s AND t.election = %(election)s
WHERE {LOCKED_BY}
"""  # noqa: S608

REQUEST_RESIGN = f"""
UPDATE celery_leader_lease AS t SET resign = t.token
FROM pg_locks AS l
WHERE t.prefix = %(prefix)s AND t.election = %(election)s AND l.pid = t.pid AND {LOCKED_BY}
RETURNING t.instance_id, t.epoch, t.token
"""  # noqa: S608

# The run ledger's marks: any process's, so no lock is checked; an expired record
# counts as absent. A write drops up to 100 expired marks (never its own: a
# statement may change a row only once).
_SWEEP = f"""
swept AS (
    DELETE FROM celery_leader_runs AS r
    WHERE (r.prefix, r.election, r.key) IN (
        SELECT prefix, election, key FROM celery_leader_runs
        WHERE prefix = %(prefix)s AND election = %(election)s AND key <> %(key)s
          AND expires <= {NOW}
        LIMIT 100)
)"""  # noqa: S608

PUT_RUN_NEW = f"""
WITH {_SWEEP}
INSERT INTO celery_leader_runs AS r (prefix, election, key, value, expires)
VALUES (%(prefix)s, %(election)s, %(key)s, %(new)s, {NOW} + %(ttl)s)
ON CONFLICT (prefix, election, key) DO UPDATE SET value = EXCLUDED.value,
                                                  expires = EXCLUDED.expires
WHERE r.expires <= {NOW}
RETURNING r.value
"""  # noqa: S608

PUT_RUN_REPLACE = f"""
UPDATE celery_leader_runs SET value = %(new)s, expires = {NOW} + %(ttl)s
WHERE prefix = %(prefix)s AND election = %(election)s AND key = %(key)s
  AND value = %(expected)s AND expires > {NOW}
RETURNING value
"""  # noqa: S608

GET_RUN = f"""
SELECT value FROM celery_leader_runs
WHERE prefix = %(prefix)s AND election = %(election)s AND key = %(key)s AND expires > {NOW}
"""  # noqa: S608

# The statement's time (its transaction's start: each runs alone): stable
# within it, so ``expires <= {_AT}`` is an index condition. clock_timestamp()
# is volatile, so the planner filtered the entry's every row with it instead.
_AT = "extract(epoch FROM now())::float8"

# An entry's run records, one statement a write: ``w`` writes the record,
# ``swept`` and ``trimmed`` drop up to ``most`` expired records and as many over
# ``keep``, ``stale`` a few of entries nobody writes any more.
_ENTRY = "prefix = %(prefix)s AND election = %(election)s AND entry = %(entry)s"
_RECORD = f"{_ENTRY} AND key = %(key)s"
_PREV = f"prev AS (SELECT tally FROM celery_leader_run_records WHERE {_RECORD})"  # noqa: S608
_KEYS = "(d.prefix, d.election, d.entry, d.key)"


def _merged(counts: str, more: str) -> str:
    """SQL of two jsonb objects of counts added up, tally by tally (zeros dropped)."""
    return f"""(
            SELECT COALESCE(jsonb_object_agg(k, n), '{{}}'::jsonb) FROM (
                SELECT k, sum(v::bigint) AS n FROM (
                    SELECT * FROM jsonb_each_text({counts})
                    UNION ALL SELECT * FROM jsonb_each_text({more})) AS c(k, v)
                GROUP BY k) AS m
            WHERE n <> 0)"""  # noqa: S608


_AFTER_WRITE = f"""
swept AS (
    DELETE FROM celery_leader_run_records AS d
    WHERE EXISTS (SELECT 1 FROM w) AND {_KEYS} IN (
        SELECT prefix, election, entry, key FROM celery_leader_run_records
        WHERE {_ENTRY} AND key <> %(key)s AND expires <= {_AT}
        ORDER BY expires LIMIT %(most)s::int)
    RETURNING d.tally
),
trimmed AS (
    DELETE FROM celery_leader_run_records AS d
    WHERE EXISTS (SELECT 1 FROM w) AND %(keep)s::int > 0 AND {_KEYS} IN (
        SELECT prefix, election, entry, key FROM celery_leader_run_records
        WHERE {_ENTRY} AND key <> %(key)s AND expires > {_AT}
        ORDER BY created
        LIMIT GREATEST(0, LEAST(%(most)s::int,
            COALESCE((SELECT kept FROM celery_leader_run_entries WHERE {_ENTRY}), 0)
            + 1 - (SELECT count(*) FROM prev) - (SELECT count(*) FROM swept) - %(keep)s::int)))
    RETURNING d.tally
),
stale AS (
    DELETE FROM celery_leader_run_records AS d USING celery_leader_run_entries AS e
    WHERE EXISTS (SELECT 1 FROM w) AND e.prefix = d.prefix AND e.election = d.election
      AND e.entry = d.entry AND e.until <= {_AT} AND {_KEYS} IN (
        SELECT prefix, election, entry, key FROM celery_leader_run_records
        WHERE prefix = %(prefix)s AND election = %(election)s AND entry <> %(entry)s
          AND expires <= {_AT}
        ORDER BY expires LIMIT 10)
    RETURNING d.entry, d.tally
),
stale_by AS (
    SELECT entry, sum(c) AS n,
           COALESCE(jsonb_object_agg(tally, -c) FILTER (WHERE tally <> ''), '{{}}') AS counts
    FROM (SELECT entry, tally, count(*) AS c FROM stale GROUP BY entry, tally) AS x
    GROUP BY entry
),
restale AS (
    UPDATE celery_leader_run_entries AS r
    SET kept = r.kept - s.n, counts = {_merged("r.counts", "s.counts")}
    FROM stale_by AS s
    WHERE r.prefix = %(prefix)s AND r.election = %(election)s AND r.entry = s.entry
),
deltas AS (
    SELECT t, sum(n) AS n FROM (
        SELECT %(tally)s::text AS t, 1 AS n FROM w
        UNION ALL SELECT tally, -1 FROM prev WHERE EXISTS (SELECT 1 FROM w)
        UNION ALL SELECT tally, -1 FROM swept
        UNION ALL SELECT tally, -1 FROM trimmed) AS x
    WHERE t <> ''
    GROUP BY t
),
e AS (
    INSERT INTO celery_leader_run_entries AS r (prefix, election, entry, kept, counts, until)
    SELECT %(prefix)s, %(election)s, %(entry)s,
           1 - (SELECT count(*) FROM prev) - (SELECT count(*) FROM swept)
             - (SELECT count(*) FROM trimmed),
           COALESCE((SELECT jsonb_object_agg(t, n) FROM deltas), '{{}}'::jsonb),
           {_AT} + %(ttl)s
    WHERE EXISTS (SELECT 1 FROM w)
    ON CONFLICT (prefix, election, entry) DO UPDATE SET
        kept = r.kept + EXCLUDED.kept,
        counts = {_merged("r.counts", "EXCLUDED.counts")},
        until = GREATEST(r.until, EXCLUDED.until)
)
SELECT 1 FROM w"""  # noqa: S608

# Expecting no record: written when none is kept, or the kept one expired; not
# while the previous release's table holds one for the key.
PUT_ENTRY_RUN_NEW = f"""
WITH {_PREV},
w AS (
    INSERT INTO celery_leader_run_records AS r
        (prefix, election, entry, key, value, tally, expires, created)
    SELECT %(prefix)s, %(election)s, %(entry)s, %(key)s, %(new)s, %(tally)s,
           {_AT} + %(ttl)s, {_AT}
    WHERE NOT EXISTS (
        SELECT 1 FROM celery_leader_runs
        WHERE prefix = %(prefix)s AND election = %(election)s AND key = %(key)s
          AND expires > {_AT})
    ON CONFLICT (prefix, election, entry, key) DO UPDATE SET
        value = EXCLUDED.value, tally = EXCLUDED.tally, expires = EXCLUDED.expires,
        created = EXCLUDED.created
    WHERE r.expires <= {_AT}
    RETURNING 1
),
{_AFTER_WRITE}
"""  # noqa: S608

PUT_ENTRY_RUN_REPLACE = f"""
WITH {_PREV},
w AS (
    UPDATE celery_leader_run_records
    SET value = %(new)s, tally = %(tally)s, expires = {_AT} + %(ttl)s
    WHERE {_RECORD} AND value = %(expected)s AND expires > {_AT}
    RETURNING 1
),
{_AFTER_WRITE}
"""  # noqa: S608

# A record the previous release kept in celery_leader_runs, replaced: it moves
# to its entry (the previous row is its ``prev``: none in the new table).
PUT_ENTRY_RUN_MIGRATE = f"""
WITH prev AS (SELECT ''::text AS tally WHERE false),
gone AS (
    DELETE FROM celery_leader_runs
    WHERE prefix = %(prefix)s AND election = %(election)s AND key = %(key)s
      AND value = %(expected)s AND expires > {_AT}
    RETURNING key
),
w AS (
    INSERT INTO celery_leader_run_records
        (prefix, election, entry, key, value, tally, expires, created)
    SELECT %(prefix)s, %(election)s, %(entry)s, key, %(new)s, %(tally)s, {_AT} + %(ttl)s, {_AT}
    FROM gone
    ON CONFLICT (prefix, election, entry, key) DO NOTHING
    RETURNING 1
),
{_AFTER_WRITE}
"""  # noqa: S608

GET_ENTRY_RUN = f"""
SELECT value FROM celery_leader_run_records WHERE {_RECORD} AND expires > {_AT}
UNION ALL
SELECT value FROM celery_leader_runs
WHERE prefix = %(prefix)s AND election = %(election)s AND key = %(key)s AND expires > {_AT}
LIMIT 1
"""  # noqa: S608

# The newest created first, by the order index; ``limit`` bounded by the caller.
RUNS_OF = f"""
SELECT key, value FROM celery_leader_run_records
WHERE {_ENTRY} AND expires > {_AT}
ORDER BY created DESC LIMIT %(limit)s
"""  # noqa: S608

# A page of entries after ``after`` (by name), each with its greatest live key
# (a backward scan of the primary key) and its counts.
RUN_SUMMARIES = f"""
SELECT e.entry, e.counts::text, l.key, l.value
FROM celery_leader_run_entries AS e
LEFT JOIN LATERAL (
    SELECT key, value FROM celery_leader_run_records AS r
    WHERE r.prefix = e.prefix AND r.election = e.election AND r.entry = e.entry
      AND r.expires > {_AT}
    ORDER BY r.key DESC LIMIT 1
) AS l ON true
WHERE e.prefix = %(prefix)s AND e.election = %(election)s AND e.entry > %(after)s
  AND e.until > {_AT}
ORDER BY e.entry LIMIT %(page)s
"""  # noqa: S608


# The fenced records of some keys (a chunk of them: see sql_facets.STATE_KEYS),
# one primary-key lookup per key, whatever the table's statistics say. Not
# `entry = ANY(%(keys)s)`: once psycopg prepares the statement, PostgreSQL's
# generic plan compares every row with every key of the array (2.6 s a chunk at
# 100,000 rows); nor a plain join with unnest, which a fresh table's stale
# statistics turn into a hash join over the whole table (0.65 s at 1,000,000).
# The LIMIT keeps the planner from pulling the lookup up into such a join.
STATE_OF = """
SELECT k.entry, s.value FROM unnest(%(keys)s::text[]) AS k (entry)
CROSS JOIN LATERAL (
    SELECT value FROM celery_leader_state
    WHERE prefix = %(prefix)s AND election = %(election)s AND entry = k.entry
    LIMIT 1
) AS s
"""


# A round of journal writes (see :func:`~..journal.journal_rounds`: each log
# has one ``keep``), in one statement. Its parts see the table as it was, so
# ``floor`` takes each log's ``keep``-th greatest key among its kept ones (a
# backward scan of the primary key, ``keep`` rows at most) and the ones
# written; ``put`` writes what reaches the floor (the last record of a key
# written twice), and the delete drops the log's keys below it: a range of the
# primary key, as many rows as fall out. Keys compare byte for byte ("C").
PUT_JOURNAL = """
WITH w AS (
    SELECT DISTINCT ON (log, log_key) log, log_key COLLATE "C" AS log_key, data, keep
    FROM unnest(%(logs)s::text[], %(keys)s::text[], %(data)s::text[], %(keeps)s::int[])
        WITH ORDINALITY AS w (log, log_key, data, keep, n)
    ORDER BY log, log_key, n DESC
),
floor AS (
    SELECT l.log, (
        SELECT a.log_key FROM (
            (SELECT j.log_key FROM celery_leader_journal AS j
             WHERE j.prefix = %(prefix)s AND j.election = %(election)s AND j.log = l.log
             ORDER BY j.log_key DESC LIMIT l.keep)
            UNION SELECT w.log_key FROM w WHERE w.log = l.log
        ) AS a
        ORDER BY a.log_key DESC OFFSET l.keep - 1 LIMIT 1
    ) AS log_key
    FROM (SELECT DISTINCT log, keep FROM w) AS l
),
put AS (
    INSERT INTO celery_leader_journal AS j (prefix, election, log, log_key, data)
    SELECT %(prefix)s, %(election)s, w.log, w.log_key, w.data
    FROM w JOIN floor AS f ON f.log = w.log
    WHERE f.log_key IS NULL OR w.log_key >= f.log_key
    ORDER BY w.log, w.log_key
    ON CONFLICT (prefix, election, log, log_key) DO UPDATE SET data = EXCLUDED.data
)
DELETE FROM celery_leader_journal AS j USING floor AS f
WHERE j.prefix = %(prefix)s AND j.election = %(election)s AND j.log = f.log
  AND j.log_key < f.log_key
"""


def ms(seconds: float) -> str:
    """A duration setting in whole milliseconds, rounded up so it never shrinks."""
    return str(max(1, math.ceil(seconds * 1000)))
