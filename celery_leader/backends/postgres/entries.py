"""The SQL of the PostgreSQL store's schedule entries: the record of edits, the
edits themselves and the read by change (see :mod:`..sql_facets`)."""

from __future__ import annotations

from ..sql_facets import ELECTION
from .sql import SCHEMA_KEY

CHANGES_READY = "SELECT to_regclass('celery_leader_entries_edits') IS NOT NULL"

# The record of edits, added to the previous release's tables (or a fresh
# schema) in one transaction; instant at any size. Rows written before recorded
# NULL: readers read everything.
ADD_CHANGES = f"""
SELECT pg_advisory_xact_lock({SCHEMA_KEY});
ALTER TABLE celery_leader_entries_version
    ADD COLUMN IF NOT EXISTS recorded bigint,
    ADD COLUMN IF NOT EXISTS changes_from bigint NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS celery_leader_entries_edits (
    prefix   text   NOT NULL,
    election text   NOT NULL,
    name     text   NOT NULL,
    version  bigint NOT NULL,
    PRIMARY KEY (prefix, election, name)
);
CREATE INDEX IF NOT EXISTS celery_leader_entries_edits_version
    ON celery_leader_entries_edits (prefix, election, version)
"""

# One statement, one snapshot: the version row, then every name edited after
# %(since)s (NULL value: removed); the third column says whether the record can answer.
ENTRIES_SINCE = f"""
SELECT NULL, version::text,
       recorded IS NOT DISTINCT FROM version AND changes_from <= %(since)s::bigint
FROM celery_leader_entries_version WHERE {ELECTION}
UNION ALL
SELECT c.name, e.value, NULL FROM celery_leader_entries_edits AS c
LEFT JOIN celery_leader_entries AS e
    ON e.prefix = c.prefix AND e.election = c.election AND e.name = c.name
WHERE c.prefix = %(prefix)s AND c.election = %(election)s AND c.version > %(since)s::bigint
  AND EXISTS (SELECT FROM celery_leader_entries_version
              WHERE {ELECTION} AND recorded = version AND changes_from <= %(since)s::bigint)
"""  # noqa: S608

# Before an editor's first edit: the version row every edit locks.
VERSION_ROW = """
INSERT INTO celery_leader_entries_version (prefix, election, version, recorded, changes_from)
VALUES (%(prefix)s, %(election)s, 0, 0, 0)
ON CONFLICT DO NOTHING
"""

# One edit a statement. ``v`` locks the version row first, so editors queue there
# and never deadlock on an entry's row; ``e`` is the compare-and-set, which
# PostgreSQL re-checks after waiting for a concurrent writer.
_LOCK = f"""
v AS (
    SELECT version, recorded, changes_from FROM celery_leader_entries_version
    WHERE {ELECTION} FOR UPDATE
)"""  # noqa: S608

_RECORD = f"""
logged AS (
    INSERT INTO celery_leader_entries_edits (prefix, election, name, version)
    SELECT %(prefix)s, %(election)s, %(name)s, version + 1 FROM v WHERE EXISTS (SELECT FROM e)
    ON CONFLICT (prefix, election, name) DO UPDATE SET version = EXCLUDED.version
),
dropped AS (
    DELETE FROM celery_leader_entries_edits AS d
    WHERE EXISTS (SELECT FROM e) AND (SELECT version + 1 FROM v) %% %(every)s::bigint = 0
      AND d.prefix = %(prefix)s AND d.election = %(election)s AND d.name <> %(name)s
      AND d.version <= (SELECT version FROM celery_leader_entries_edits WHERE {ELECTION}
                        ORDER BY version DESC OFFSET %(kept)s::bigint LIMIT 1)
    RETURNING d.version
),
bumped AS (
    UPDATE celery_leader_entries_version AS t
    SET version = v.version + 1, recorded = v.version + 1,
        changes_from = GREATEST(
            CASE WHEN v.recorded IS DISTINCT FROM v.version THEN v.version ELSE v.changes_from END,
            (SELECT max(version) FROM dropped))
    FROM v
    WHERE t.prefix = %(prefix)s AND t.election = %(election)s AND EXISTS (SELECT FROM e)
)
SELECT count(*) FROM e
"""  # noqa: S608

CREATE_ENTRY = f"""
WITH {_LOCK},
e AS (
    INSERT INTO celery_leader_entries (prefix, election, name, value)
    SELECT %(prefix)s, %(election)s, %(name)s, %(new)s FROM v
    ON CONFLICT DO NOTHING RETURNING 1
),
{_RECORD}"""  # noqa: S608

REPLACE_ENTRY = f"""
WITH {_LOCK},
e AS (
    UPDATE celery_leader_entries SET value = %(new)s
    WHERE EXISTS (SELECT FROM v) AND {ELECTION} AND name = %(name)s AND value = %(expected)s
    RETURNING 1
),
{_RECORD}"""  # noqa: S608

DELETE_ENTRY = f"""
WITH {_LOCK},
e AS (
    DELETE FROM celery_leader_entries
    WHERE EXISTS (SELECT FROM v) AND {ELECTION} AND name = %(name)s AND value = %(expected)s
    RETURNING 1
),
{_RECORD}"""  # noqa: S608
