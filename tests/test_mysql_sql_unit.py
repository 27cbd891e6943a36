"""The MySQL store's SQL where MySQL and MariaDB differ, without a server.

The suite's server is MariaDB (Debian has no MySQL server package), so the
MySQL branch of each difference is pinned here.
"""

from __future__ import annotations

import pytest

from celery_leader.backends.mysql.sql import statement_deadline


@pytest.mark.parametrize(
    "version",
    ["10.11.6-MariaDB-0+deb12u1", "11.4.2-MariaDB-log", "10.6.16-MariaDB-1:10.6.16+maria~ubu2204"],
)
def test_mariadb_cancels_any_statement_in_seconds(version: str) -> None:
    sql, params = statement_deadline(version, 0.45)
    assert sql == "SET SESSION max_statement_time = %(seconds)s"
    assert params == {"seconds": 0.45}


@pytest.mark.parametrize(
    "version",
    ["8.0.36", "8.0.36-0ubuntu0.22.04.1", "8.4.0-log", "8.0.35-27", "8.0.mysql_aurora.3.05.2"],
)
def test_mysql_cancels_selects_in_milliseconds(version: str) -> None:
    sql, params = statement_deadline(version, 0.45)
    assert sql == "SET SESSION max_execution_time = %(ms)s"
    assert params == {"ms": 450}
    # Never 0, which would switch MySQL's limit off...
    assert statement_deadline(version, 0.0004)[1] == {"ms": 1}
    # ...unless asked to (a follower's lock wait outlasts the deadline).
    assert statement_deadline(version, None)[1] == {"ms": 0}


def test_no_deadline_on_mariadb_is_zero() -> None:
    assert statement_deadline("10.11.6-MariaDB", None)[1] == {"seconds": 0.0}
