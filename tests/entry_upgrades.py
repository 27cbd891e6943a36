"""What a SQL store of this release reads of the entries a previous release wrote.

The previous release kept no record of edits. Its tables gain one on first use,
and an edit it did not record (made before the upgrade, or by one of its editors
still running) makes a reader from before that edit read everything: never miss
an edit. The PostgreSQL and MySQL tests seed the old tables their own way and
share these steps.
"""

from __future__ import annotations

from collections.abc import Callable

from celery_leader.backends import Edit, StoreFacets


def read_by_change_after_the_upgrade(
    reader: StoreFacets, editor: StoreFacets, election: str, edit_by_previous: Callable[[], None]
) -> None:
    """``election`` holds ``x = x1`` at version 3, written by the previous release;
    ``edit_by_previous`` replaces it with ``x2`` the previous release's way."""
    assert reader.entries.load(election) == (3, {"x": "x1"})
    assert reader.entries.changes_since(election, 3) == (3, {})
    assert reader.entries.changes_since(election, 2) is None

    assert editor.entries.edit(election, [Edit("y", None, "y1")]) == [True]
    assert reader.entries.changes_since(election, 3) == (4, {"y": "y1"})
    assert reader.entries.changes_since(election, 2) is None, "edit 3 was not recorded"

    edit_by_previous()
    assert reader.entries.version(election) == 5
    assert reader.entries.changes_since(election, 4) is None, "edit 5 was not recorded"
    assert editor.entries.edit(election, [Edit("y", "y1", None)]) == [True]
    assert reader.entries.changes_since(election, 4) is None
    assert reader.entries.changes_since(election, 5) == (6, {"y": None})
    assert reader.entries.load(election) == (6, {"x": "x2"})
