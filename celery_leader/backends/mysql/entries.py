"""The SQL of the MySQL / MariaDB store's schedule entries: edits, reads by page
and by change (the same record of edits as the PostgreSQL store's).

Every applied edit moves the election's entries version and records the edited
name in ``celery_leader_entries_edits`` with the version of its edit, so a
reader is told what changed since its version instead of reading every entry.
The record keeps the latest :data:`CHANGES_KEPT` names; ``changes_from`` (on
the version row) is the oldest version a reader may ask from. A version row
whose ``recorded`` is not its ``version`` was moved by an edit that recorded
nothing (a previous release): readers from before it read everything.
"""

from __future__ import annotations

from .sql import SCHEMA_LOCK

#: Entries read per statement when reading them all: a few MB, so a million
#: entries never make one statement that outlasts the store deadline.
ENTRIES_PAGE = 10_000

#: Edited names kept in the record of edits (as on Redis): a reader that fell
#: further behind reads every entry. Dropped in steps of :data:`DROP_EVERY`
#: versions, so an edit seldom pays for the drop.
CHANGES_KEPT = 10_000
DROP_EVERY = 100

CHANGES_READY = """
SELECT COUNT(*) FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name = 'celery_leader_entries_edits'
"""

# Added to the tables of the previous release (or of a fresh schema): the
# version row's two columns (MySQL has no ADD COLUMN IF NOT EXISTS: a statement
# prepared from what information_schema says), then the table. Nothing reads or
# rewrites the entries themselves, so it is quick at any size. Rows written
# before have recorded NULL: readers read everything.
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

_ELECTION = "prefix = %(prefix)s AND election = %(election)s"

ENTRIES_VERSION = f"SELECT version FROM celery_leader_entries_version WHERE {_ELECTION}"  # noqa: S608

# Pages in name order (keyset: the primary key's range). The version is read
# before the first page: an edit during the pages moves it past the one
# returned, and the reader asks again at its next look.
ENTRIES_FIRST_PAGE = f"""
SELECT name, value FROM celery_leader_entries WHERE {_ELECTION}
ORDER BY name LIMIT %(page)s
"""  # noqa: S608
ENTRIES_NEXT_PAGE = f"""
SELECT name, value FROM celery_leader_entries WHERE {_ELECTION} AND name > %(after)s
ORDER BY name LIMIT %(page)s
"""  # noqa: S608

# One transaction, one snapshot (whatever the server's default isolation): the
# version row, whether the record can answer from %(since)s, then every name
# edited after it with its value (NULL: removed), read only when it can.
ENTRIES_SINCE = f"""
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ;
START TRANSACTION WITH CONSISTENT SNAPSHOT;
SELECT version, recorded <=> version AND changes_from <= %(since)s
FROM celery_leader_entries_version WHERE {_ELECTION};
SELECT c.name, e.value FROM celery_leader_entries_edits AS c
LEFT JOIN celery_leader_entries AS e
    ON e.prefix = c.prefix AND e.election = c.election AND e.name = c.name
WHERE c.prefix = %(prefix)s AND c.election = %(election)s AND c.version > %(since)s
  AND EXISTS (SELECT 1 FROM celery_leader_entries_version
              WHERE {_ELECTION} AND recorded = version AND changes_from <= %(since)s);
COMMIT
"""  # noqa: S608

LOAD_ENTRY = f"SELECT value FROM celery_leader_entries WHERE {_ELECTION} AND name = %(name)s"  # noqa: S608

# Unfenced entry edits (no lock needed): each is a single-row compare-and-set,
# run as the third statement of EDIT_ENTRY.
CREATE_ENTRY = """
INSERT IGNORE INTO celery_leader_entries (prefix, election, name, value)
VALUES (%(prefix)s, %(election)s, %(name)s, %(new)s)
"""
REPLACE_ENTRY = f"""
UPDATE celery_leader_entries SET value = %(new)s
WHERE {_ELECTION} AND name = %(name)s AND value = %(expected)s
"""  # noqa: S608
DELETE_ENTRY = f"""
DELETE FROM celery_leader_entries
WHERE {_ELECTION} AND name = %(name)s AND value = %(expected)s
"""  # noqa: S608

# One edit, one transaction, one round trip. The version row is locked first
# (made if need be; LAST_INSERT_ID() is then its version), so editors queue
# there and never deadlock on an entry's row. When the edit applied, the name is
# recorded at the new version, the oldest records beyond CHANGES_KEPT go now
# and then, and the version row moves (``changes_from`` past any unrecorded
# edit and any dropped record; assignments read the row as it was).
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
    @celery_leader_applied > 0 AND (LAST_INSERT_ID() + 1) %% {DROP_EVERY} = 0,
    (SELECT version FROM celery_leader_entries_edits WHERE {_ELECTION}
     ORDER BY version DESC LIMIT 1 OFFSET {CHANGES_KEPT}),
    NULL);
DELETE FROM celery_leader_entries_edits
WHERE {_ELECTION} AND version <= @celery_leader_dropped AND name <> %(name)s;
UPDATE celery_leader_entries_version
SET changes_from = GREATEST(IF(recorded <=> version, changes_from, version),
                            COALESCE(@celery_leader_dropped, 0)),
    version = LAST_INSERT_ID() + 1, recorded = LAST_INSERT_ID() + 1
WHERE {_ELECTION} AND @celery_leader_applied > 0;
COMMIT
"""  # noqa: S608

#: Where the edit's own result is among EDIT_ENTRY's statements.
EDIT_RESULT = 2
