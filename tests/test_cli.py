"""``celery -A app leader status|resign`` against a real Redis and real leases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_leader.backends import create_backend
from celery_leader.config import LeaderConfig
from celery_leader.lease import Lease
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


@pytest.fixture
def url(redis_server: RedisServer, redis_url: str) -> str:
    """The test Redis, reached as a user with a password (which must never be printed)."""
    with redis_server.client() as client:
        client.acl_setuser("cli", enabled=True, passwords=[f"+{PASSWORD}"], keys="*",
                           channels="*", commands=["+@all"])  # fmt: skip
    return redis_url.replace("redis://", f"redis://cli:{PASSWORD}@")


@pytest.fixture
def leases(url: str) -> Iterator[list[Lease]]:
    made: list[Lease] = []
    yield made
    for lease in made:
        lease.stop()
        lease.backend.close()


def join(leases: list[Lease], url: str, instance_id: str) -> Lease:
    config = LeaderConfig.from_mapping(
        {"leader_url": url, "leader_ttl": TTL, "leader_instance_id": instance_id}
    )
    lease = Lease.from_config("beat", config, create_backend(config))
    lease.start()
    leases.append(lease)
    return lease


def test_status_names_holder_epoch_and_ttl_with_the_password_masked(
    url: str, leases: list[Lease]
) -> None:
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
    assert rows["worker"] == {"election": "worker", "holder": None, "epoch": None,
                              "ttl_remaining": None}  # fmt: skip

    table = leader_cli(url, "status")
    assert table.returncode == 0, table.stderr
    assert PASSWORD not in table.stdout + table.stderr
    beat_line = next(line for line in table.stdout.splitlines() if line.startswith("beat "))
    assert "holder-1" in beat_line and str(holder.epoch) in beat_line


def test_resign_hands_over_to_another_instance(url: str, leases: list[Lease]) -> None:
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


def test_unreachable_store_is_one_clear_error(redis_server: RedisServer) -> None:
    redis_server.stop()
    run = leader_cli(redis_server.url, "status")
    assert run.returncode == 1
    assert f"store {redis_server.url} unreachable" in run.stderr
    assert "Traceback" not in run.stderr
