"""``celery -A app leader status|resign`` against a real Redis and real leases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from celery_leader.backends import StoreFacets, open_store
from celery_leader.election.lease import Lease
from celery_leader.settings.config import LeaderConfig
from harness.servers import RedisServer
from harness.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
CELERY_MAIN = "from celery.__main__ import main; main()"
TTL = 2.0
PASSWORD = "s3cret-pw"


def leader_cli(leader_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "BROKER_URL": "memory://",
        "LEADER_URL": leader_url,
        "LEADER_TTL": str(TTL),
    }
    return subprocess.run(
        [sys.executable, "-c", CELERY_MAIN, "-A", "tests.apps.beat_app", "leader", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


#: The leases a test started, each with the store it opened for it.
Joined = list[tuple[Lease, StoreFacets]]


@pytest.fixture
def url(redis_server: RedisServer, redis_url: str) -> str:
    """The test Redis, reached as a user with a password (which must never be printed)."""
    with redis_server.client() as client:
        client.acl_setuser("cli", enabled=True, passwords=[f"+{PASSWORD}"], keys="*",
                           channels="*", commands=["+@all"])  # fmt: skip
    return redis_url.replace("redis://", f"redis://cli:{PASSWORD}@")


@pytest.fixture
def leases(url: str) -> Iterator[Joined]:
    made: Joined = []
    yield made
    for lease, store in made:
        lease.stop()
        store.close()


def join(leases: Joined, url: str, instance_id: str) -> Lease:
    config = LeaderConfig.from_mapping(
        {"leader_url": url, "leader_ttl": TTL, "leader_instance_id": instance_id}
    )
    store = open_store(config)
    lease = Lease.from_config("beat", config, store.lock)
    lease.start()
    leases.append((lease, store))
    return lease


def test_status_names_holder_epoch_and_ttl_with_the_password_masked(
    url: str, leases: Joined
) -> None:
    started = time.time()
    holder = join(leases, url, "holder-1")
    wait_for(holder.is_leader, 5, message="holder-1 leads")

    as_json = leader_cli(url, "status", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert PASSWORD not in as_json.stdout + as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["store"] == url.replace(PASSWORD, "***")
    rows = {row["election"]: row for row in data["elections"]}
    assert rows["beat"]["holder"] == "holder-1"
    assert rows["beat"]["epoch"] == holder.epoch
    assert 0 < rows["beat"]["ttl_remaining"] <= TTL
    # Since when: the term's start on the store's clock (this host's, here).
    assert started - 1.0 <= rows["beat"]["since"] <= time.time()
    assert rows["worker"] == {"election": "worker", "holder": None, "epoch": None,
                              "ttl_remaining": None, "since": None}  # fmt: skip

    table = leader_cli(url, "status")
    assert table.returncode == 0, table.stderr
    assert PASSWORD not in table.stdout + table.stderr
    beat_line = next(line for line in table.stdout.splitlines() if line.startswith("beat "))
    assert "holder-1" in beat_line and str(holder.epoch) in beat_line
    since = datetime.fromtimestamp(rows["beat"]["since"], timezone.utc)
    assert beat_line.endswith(since.strftime("%Y-%m-%d %H:%M:%SZ"))


def test_resign_hands_over_to_another_instance(url: str, leases: Joined) -> None:
    first = join(leases, url, "first")
    wait_for(first.is_leader, 5, message="first leads")
    second = join(leases, url, "second")

    run = leader_cli(url, "resign")
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"asked first (epoch {first_epoch(run)}) to hand over 'beat'" in run.stdout
    assert "second leads 'beat' now" in run.stdout
    # The CLI saw the new term in the store; the lease's own belief follows at once.
    wait_for(second.is_leader, 1, message="second believes it leads")
    assert not first.is_leader()


def first_epoch(run: subprocess.CompletedProcess[str]) -> str:
    return run.stdout.split("(epoch ", 1)[1].split(")", 1)[0]


def test_resign_when_nobody_leads_fails_clearly(url: str) -> None:
    run = leader_cli(url, "resign", "reports")
    assert run.returncode == 1
    assert "nobody leads 'reports'" in run.stderr


def test_bad_settings_are_a_usage_error_naming_the_setting() -> None:
    run = leader_cli(f"mongodb://u:{PASSWORD}@db/x", "status")
    assert run.returncode == 2
    assert "leader_url has unknown scheme 'mongodb'" in run.stderr
    assert PASSWORD not in run.stderr


def test_unreachable_store_is_one_clear_error_and_exit_code_2(redis_server: RedisServer) -> None:
    redis_server.stop()
    for run in (leader_cli(redis_server.url, "status"), module_cli(redis_server.url, "status")):
        assert run.returncode == 2, run.stdout + run.stderr
        assert f"store {redis_server.url} unreachable" in run.stderr
        assert "Traceback" not in run.stderr


def module_cli(leader_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m celery_leader ...`` with settings from CELERY_LEADER_* and no Celery.

    ``-S -I`` would drop site-packages too; instead a meta path hook refuses to import
    ``celery`` (and ``click``), so a stray import fails the command.
    """
    no_celery = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('celery', 'click', 'kombu'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import runpy; sys.argv[0] = 'celery_leader'\n"
        "runpy.run_module('celery_leader', run_name='__main__', alter_sys=True)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", no_celery, *args],
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "CELERY_LEADER_URL": leader_url,
            "CELERY_LEADER_TTL": str(TTL),
            **env,
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_status_exit_codes_say_whether_someone_leads(url: str, leases: Joined) -> None:
    for run in (leader_cli(url, "status"), module_cli(url, "status")):
        assert run.returncode == 3, run.stdout + run.stderr
        assert "(nobody)" in run.stdout
    holder = join(leases, url, "holder-1")
    wait_for(holder.is_leader, 5, message="holder-1 leads")
    assert leader_cli(url, "status").returncode == 0
    # Named elections must each have a leader.
    assert leader_cli(url, "status", "beat").returncode == 0
    assert module_cli(url, "status", "beat", "worker").returncode == 3


def test_the_module_prints_what_the_celery_command_prints(url: str, leases: Joined) -> None:
    holder = join(leases, url, "holder-1")
    wait_for(holder.is_leader, 5, message="holder-1 leads")
    celery_json = json.loads(leader_cli(url, "status", "--json").stdout)
    module_json = json.loads(module_cli(url, "status", "--json").stdout)
    for data in (celery_json, module_json):
        for row in data["elections"]:
            row.pop("ttl_remaining")
        # Measured by each command on its own: this host's clock against the store's.
        assert abs(data.pop("clock_offset")) < 1.0 and 0 <= data.pop("clock_error") < 1.0
        assert data["clock_problem"] is None
    assert module_json == celery_json
    table = module_cli(url, "status")
    assert table.returncode == 0, table.stderr
    assert PASSWORD not in table.stdout + table.stderr
    header = table.stdout.splitlines()[1]
    assert header.split() == ["ELECTION", "HOLDER", "EPOCH", "TTL", "LEFT", "SINCE", "(UTC)"]

    second = join(leases, url, "second")
    run = module_cli(url, "resign")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "second leads 'beat' now" in run.stdout
    wait_for(second.is_leader, 1, message="second believes it leads")


def test_epoch_column_fits_13_digit_epochs(url: str, redis_server: RedisServer) -> None:
    # An epoch seeded from the store's clock in milliseconds (as the Redis backend does
    # when its epoch key is missing) has 13 digits.
    config = LeaderConfig.from_mapping({"leader_url": url, "leader_ttl": TTL})
    store = open_store(config)
    try:
        # A ttl no CLI start-up outlasts, even on a loaded machine.
        term = store.lock.acquire("beat", "holder-ms", 60, 1_765_000_000_000).term
        assert term is not None and len(str(term.epoch)) == 13
        table = leader_cli(url, "status")
        header, beat = (
            table.stdout.splitlines()[1],
            next(line for line in table.stdout.splitlines() if line.startswith("beat ")),
        )
        # Right-aligned under its header, with a space before the next column.
        end = header.index("EPOCH") + len("EPOCH")
        assert beat[end - 13 : end] == str(term.epoch)
        assert beat[end] == " "
        store.lock.release("beat", term)
    finally:
        store.close()


def test_check_reads_the_health_file(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    missing = module_cli("memory://", "check", "--file", str(path))
    assert missing.returncode == 1
    assert missing.stdout.strip() == f"UNHEALTHY: no health file at {path}"
    now = time.time()
    healthy = {
        **{"election": "beat", "role": "follower", "epoch": None, "store_reachable": True},
        **{"updated": now, "stale_after": now + 10, "last_tick": now, "tick_due_by": now + 5},
    }
    path.write_text(json.dumps(healthy))
    for run in (
        module_cli("memory://", "check", "--file", str(path)),
        leader_cli("memory://", "check", "--file", str(path)),
        module_cli("memory://", "check", CELERY_LEADER_HEALTH_FILE=str(path)),
    ):
        assert run.returncode == 0, run.stdout + run.stderr
        assert run.stdout.startswith("OK: follower of 'beat'") and run.stdout.count("\n") == 1
    path.write_text(json.dumps({**healthy, "tick_due_by": now - 1}))
    overdue = module_cli("memory://", "check", "--file", str(path))
    assert overdue.returncode == 1
    assert "tick is overdue" in overdue.stdout
    path.write_text(json.dumps({**healthy, "updated": now - 30}))
    old = leader_cli("memory://", "check", "--file", str(path), "--max-age", "20")
    assert old.returncode == 1
    assert "max age 20" in old.stdout
