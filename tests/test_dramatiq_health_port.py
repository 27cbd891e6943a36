"""``leader_health_port`` in a real ``dramatiq`` node with two worker processes.

Both worker processes campaign in the ``worker`` election with a lease of
their own; one of them binds the port and the other skips it with one DEBUG
line. With ``scheduler=True`` the scheduler's fork process serves it instead.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_leader.backends import HolderInfo, open_store
from celery_leader.settings.config import LeaderConfig
from harness.procs import Proc, Procs
from harness.servers import RedisServer, free_port
from harness.waiting import wait_for
from tests.test_dramatiq_actors import app_env
from tests.test_dramatiq_chaos import APP, DRAMATIQ, HOST, REPO

pytestmark = pytest.mark.slow

SERVES = re.compile(r"process (\d+) serves leader_health_port (\d+) for '(\w+)'")
SKIPS = "leader_health_port {port} is taken (another worker process of this node serves it)"


@pytest.fixture
def broker_url() -> Iterator[str]:
    with RedisServer() as server:
        yield server.url


def get(port: int, path: str) -> tuple[int, str]:
    """Status and body of ``GET path``; (0, why) while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def node(procs: Procs, env: dict[str, str]) -> Proc:
    """One ``dramatiq`` node, two worker processes, verbose (DEBUG) logging."""
    proc = procs.spawn_python(
        DRAMATIQ, APP, "-p", "2", "-t", "1", "--queues", "waiting", "-v", env=env, cwd=REPO
    )
    wait_for(lambda: proc.output().count("ready for action") >= 2, 60, message="two processes")
    return proc


def holder(leader_url: str, election: str) -> HolderInfo:
    config = LeaderConfig.from_env(env={}, leader_url=leader_url)
    backend = open_store(config)
    try:
        return wait_for(
            lambda: backend.lock.holder(election), 15, message=f"a holder of {election!r}"
        )
    finally:
        backend.close()


def test_one_worker_process_serves_the_port_and_names_the_holder(
    procs: Procs, broker_url: str, redis_url: str, tmp_path: Path
) -> None:
    port = free_port()
    env = app_env(broker_url, redis_url, tmp_path / "record", CELERY_LEADER_HEALTH_PORT=str(port))
    proc = node(procs, env)

    status, body = wait_for(lambda: (r := get(port, "/healthz"))[0] and r, 15, message="answers")
    assert status == 200 and body.startswith("OK: ") and "of 'worker'" in body, body
    leading = holder(redis_url, "worker")
    assert leading.instance_id.startswith(f"{HOST}:")
    # The serving process names the holder, whichever of the two leads.
    seen = wait_for(
        lambda: (d := json.loads(get(port, "/leader")[1]))["epoch"] == leading.epoch and d,
        10,
        message="/leader names the current term",
    )
    assert seen["election"] == "worker" and seen["holder"] == leading.instance_id, seen
    assert seen["since"] == leading.since, "the term's start as the store recorded it"

    # Exactly one process bound the port; the other said so once, at DEBUG.
    serving = [m.groups() for m in SERVES.finditer(proc.output())]
    assert len(serving) == 1 and serving[0][1:] == (str(port), "worker"), serving
    assert proc.output().count(SKIPS.format(port=port)) == 1, proc.output()[-3000:]
    server_pid = int(serving[0][0])
    assert seen["this_process_leads"] == (leading.instance_id == f"{HOST}:{server_pid}")


def test_with_the_embedded_scheduler_its_process_serves_the_port(
    procs: Procs, broker_url: str, redis_url: str, tmp_path: Path
) -> None:
    port = free_port()
    env = app_env(
        broker_url,
        redis_url,
        tmp_path / "record",
        CELERY_LEADER_HEALTH_PORT=str(port),
        EMBEDDED="1",
    )
    proc = node(procs, env)
    status, body = wait_for(lambda: (r := get(port, "/healthz"))[0] and r, 15, message="answers")
    assert status == 200 and "of 'beat'" in body, body
    leading = holder(redis_url, "beat")
    seen = wait_for(
        lambda: (d := json.loads(get(port, "/leader")[1]))["epoch"] == leading.epoch and d,
        10,
        message="/leader names the scheduler's term",
    )
    assert seen["election"] == "beat" and seen["holder"] == leading.instance_id, seen
    # The worker processes campaign in "worker" but leave the port alone.
    assert not SERVES.search(proc.output()) and SKIPS.format(port=port) not in proc.output()
