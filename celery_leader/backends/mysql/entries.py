"""The SQL of the MySQL / MariaDB store's schedule entries: the record of edits,
the edits themselves and the read by change (see :mod:`..sql_facets`)."""

from __future__ import annotations

from ..sql_facets import ELECTION
from .sql import SCHEMA_LOCK

CHANGES_READY = """
SELECT COUNT(*) FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name = 'celery_leader_entries_edits'
"""

# Added to the previous release's tables (or a fresh schema): the version row's
# two columns (no ADD COLUMN IF NOT EXISTS: prepared from information_schema), then
# the table. Quick at any size; rows written before recorded NULL (read everything).
ADD_CHANGES = f"""
DO GET_LOCK('{SCHEMA_LOCK}', 10);
SET @celery_leader_ddl = IF(
    (SELECT COUNT(*) FROM information_schema.columns
     WHERE table_schema = DATABASE() AND table_name = 'celery_leader_entries_version'
       AND column_name = 'recorded') = 0,
    'ALTER TABLE celery_leader_entries_version ADD COLUMN recorded BIGINT NULL,
         ADD COLUMN changes_from BIGINT NOT NULL DEFAULT 0',
    'DO 0');
PREPARE celery_leader_ddl FROM @celery_leader_ddl;
EXECUTE celery_leader_ddl;
DEALLOCATE PREPARE celery_leader_ddl;
CREATE TABLE IF NOT EXISTS celery_leader_entries_edits (
    prefix   VARCHAR(190) NOT NULL,
    election VARCHAR(190) NOT NULL,
    name     VARCHAR(190) NOT NULL,
    version  BIGINT       NOT NULL,
    PRIMARY KEY (prefix, election, name),
    KEY celery_leader_entries_edits_version (prefix, election, version)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
DO RELEASE_LOCK('{SCHEMA_LOCK}')
"""  # noqa: S608

# One transaction, one snapshot: the version row, whether the record can answer
# from %(since)s, then every name edited after it (NULL value: removed).
ENTRIES_SINCE = f"""
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ;
START TRANSACTION WITH CONSISTENT SNAPSHOT;
SELECT version, recorded <=> version AND changes_from <= %(since)s
FROM celery_leader_entries_version WHERE {ELECTION};
SELECT c.name, e.value FROM celery_leader_entries_edits AS c
LEFT JOIN celery_leader_entries AS e
    ON e.prefix = c.prefix AND e.election = c.election AND e.name = c.name
WHERE c.prefix = %(prefix)s AND c.election = %(election)s AND c.version > %(since)s
  AND EXISTS (SELECT 1 FROM celery_leader_entries_version
              WHERE {ELECTION} AND recorded = version AND changes_from <= %(since)s);
COMMIT
"""  # noqa: S608

# Unfenced entry edits (no lock needed): each is a single-row compare-and-set,
# run as the third statement of EDIT_ENTRY.
CREATE_ENTRY = """
INSERT IGNORE INTO celery_leader_entries (prefix, election, name, value)
VALUES (%(prefix)s, %(election)s, %(name)s, %(new)s)
"""
REPLACE_ENTRY = f"""
UPDATE celery_leader_entries SET value = %(new)s
WHERE {ELECTION} AND name = %(name)s AND value = %(expected)s
"""  # noqa: S608
DELETE_ENTRY = f"""
DELETE FROM celery_leader_entries
WHERE {ELECTION} AND name = %(name)s AND value = %(expected)s
"""  # noqa: S608

# One edit, one transaction, one round trip. The version row is locked first, so
# editors queue there and never deadlock on an entry's row; an applied edit is
# recorded at the new version (assignments read the row as it was).
EDIT_ENTRY = f"""
START TRANSACTION;
INSERT INTO celery_leader_entries_version (prefix, election, version, recorded, changes_from)
VALUES (%(prefix)s, %(election)s, LAST_INSERT_ID(0), 0, 0)
ON DUPLICATE KEY UPDATE version = LAST_INSERT_ID(version);
{{edit}};
SET @celery_leader_applied = ROW_COUNT();
INSERT INTO celery_leader_entries_edits (prefix, election, name, version)
SELECT %(prefix)s, %(election)s, %(name)s, LAST_INSERT_ID() + 1 FROM DUAL
WHERE @celery_leader_applied > 0
ON DUPLICATE KEY UPDATE version = VALUES(version);
SET @celery_leader_dropped = IF(
    @celery_leader_applied > 0 AND (LAST_INSERT_ID() + 1) %% %(every)s = 0,
    (SELECT version FROM celery_leader_entries_edits WHERE {ELECTION}
     ORDER BY version DESC LIMIT 1 OFFSET %(kept)s),
    NULL);
DELETE FROM celery_leader_entries_edits
WHERE {ELECTION} AND version <= @celery_leader_dropped AND name <> %(name)s;
UPDATE celery_leader_entries_version
SET changes_from = GREATEST(IF(recorded <=> version, changes_from, version),
                            COALESCE(@celery_leader_dropped, 0)),
    version = LAST_INSERT_ID() + 1, recorded = LAST_INSERT_ID() + 1
WHERE {ELECTION} AND @celery_leader_applied > 0;
COMMIT
"""  # noqa: S608

#: Where the edit's own result is among EDIT_ENTRY's statements.
EDIT_RESULT = 2
