"""Leader-only Dramatiq actors in real ``dramatiq`` processes on Redis.

Three replicas of tests/apps/dramatiq_app.py, two worker processes each: every
process holds its own lease of the ``worker`` election. The bodies append
``actor n pid epoch`` to a file, so the test sees who ran what under which term.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

from celery_leader.backends import open_store
from celery_leader.settings.config import LeaderConfig
from harness.procs import Proc, Procs
from harness.servers import RedisServer
from harness.waiting import wait_for
from tests.test_dramatiq_chaos import (
    APP,
    DRAMATIQ,
    HOST,
    REPO,
    Tap,
    check_slots,
    leader_pid,
)

pytestmark = pytest.mark.slow

READY = r"Worker process is ready for action"


@pytest.fixture
def broker_url(tmp_path: Path) -> Iterator[str]:
    with RedisServer() as server:
        yield server.url


def records(path: Path) -> list[tuple[str, int, int, int | None]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        actor, n, pid, epoch = line.split()
        rows.append((actor, int(n), int(pid), None if epoch == "None" else int(epoch)))
    return rows


def start(procs: Procs, env: dict[str, str], queues: str, *extra: str) -> list[Proc]:
    replicas = [
        procs.spawn_python(
            DRAMATIQ, APP, "-p", "2", "-t", "1", "--queues", queues, *extra, env=env, cwd=REPO
        )
        for _ in range(3)
    ]
    for proc in replicas:
        wait_for(lambda p=proc: p.output().count("ready for action") >= 2, 60, message="boot")
    return replicas


def send(broker_url: str, actor: str, count: int) -> None:
    broker = RedisBroker(url=broker_url)
    broker.declare_queue(actor)
    for n in range(count):
        broker.enqueue(dramatiq.Message(actor, actor, (n,), {}, {}))
    broker.close()


def app_env(broker_url: str, leader_url: str, record: Path, **extra: str) -> dict[str, str]:
    return {
        "BROKER_URL": broker_url,
        "LEADER_URL": leader_url,
        "LEADER_TTL": "3",
        "RECORD": str(record),
        "PYTHONPATH": str(REPO),
        # One message in hand per process: the SIGKILLed leader strands at most one.
        "dramatiq_queue_prefetch": "1",
        **extra,
    }


def worker_leader(leader_url: str) -> int:
    config = LeaderConfig.from_env(env={}, leader_url=leader_url, leader_ttl=3)
    config = LeaderConfig(**{**config.__dict__, "beat_election": "worker"})
    return leader_pid(config, 15)


def test_wait_mode_runs_each_message_once_across_a_sigkill_of_the_leader(
    procs: Procs, broker_url: str, redis_url: str, tmp_path: Path
) -> None:
    record = tmp_path / "record"
    start(procs, app_env(broker_url, redis_url, record), "waiting")
    first = worker_leader(redis_url)
    send(broker_url, "waiting", 100)
    wait_for(lambda: len(records(record)) >= 30, 30, message="30 messages run")
    # Strike in the middle of a body (each sleeps 20 ms), not between record and ack.
    time.sleep(0.01)
    os.kill(first, signal.SIGKILL)
    killed_at = len(records(record))
    wait_for(
        lambda: len({n for _, n, _, _ in records(record)}) == 100,
        60,
        message=lambda: f"all 100 run; so far {len(records(record))}",
    )
    rows = records(record)
    twice = [n for n, c in Counter(n for _, n, _, _ in rows).items() if c > 1]
    assert not twice, f"run twice: {twice}"
    assert all(epoch is not None for *_, epoch in rows), "a body ran without leading"
    by_epoch: dict[int | None, set[int]] = {}
    for _, _, pid, epoch in rows:
        by_epoch.setdefault(epoch, set()).add(pid)
    assert all(len(pids) == 1 for pids in by_epoch.values()), by_epoch
    assert {pid for _, _, pid, _ in rows[:killed_at]} == {first}
    assert first not in {pid for _, _, pid, _ in rows[killed_at + 1 :]}
    epochs = [epoch or 0 for *_, epoch in rows]
    assert epochs == sorted(epochs)


@pytest.mark.parametrize("broken", [False, True], ids=["check-works", "check-raises"])
def test_skip_mode_never_runs_on_a_follower(
    procs: Procs, broker_url: str, redis_url: str, tmp_path: Path, broken: bool
) -> None:
    record = tmp_path / "record"
    env = app_env(broker_url, redis_url, record, BREAK_CHECK="1" if broken else "0")
    replicas = start(procs, env, "skipping")
    send(broker_url, "skipping", 30)

    def handled() -> int:
        logs = "".join(p.output() for p in replicas)
        return logs.count("was skipped") + len(records(record))

    wait_for(lambda: handled() >= 30, 30, message=lambda: f"30 handled, {handled()} so far")
    rows = records(record)
    if broken:
        assert rows == [], "a body ran although every leadership check raised"
        assert "leadership check of 'worker' failed" in "".join(p.output() for p in replicas)
    else:
        assert len({pid for _, _, pid, _ in rows}) <= 1, rows
        assert all(epoch is not None for *_, epoch in rows), rows


def test_use_spawn_runs_the_scheduler_and_leader_only_actors(
    procs: Procs, broker_url: str, redis_url: str, tmp_path: Path
) -> None:
    record = tmp_path / "record"
    env = app_env(broker_url, redis_url, record, EMBEDDED="1")
    start(procs, env, "waiting", "--use-spawn")
    tap = Tap(redis.Redis.from_url(broker_url))
    try:
        wait_for(lambda: len(tap.sent()) >= 5, 30, message="slots from a spawned scheduler")
        send(broker_url, "waiting", 5)
        wait_for(lambda: len(records(record)) == 5, 30, message="wait-mode messages run")
        assert len({pid for _, _, pid, _ in records(record)}) == 1
        check_slots(tap.sent())
    finally:
        tap.close()


@pytest.mark.timing  # a hand-over within 0.5 s
def test_sigterm_to_the_process_group_releases_worker_leases_at_once(
    procs: Procs, broker_url: str, redis_url: str, tmp_path: Path
) -> None:
    """systemd's SIGTERM reaches every process and Dramatiq relays another; the lease is
    released at the signal, not at the worker's next one-second poll, and never leaks
    (which would leave the election empty for the 3 s ttl)."""
    replicas = start(procs, app_env(broker_url, redis_url, tmp_path / "record"), "skipping")
    first = worker_leader(redis_url)
    replica = next(p for p in replicas if os.getpgid(first) == p.pid)
    config = LeaderConfig.from_env(env={}, leader_url=redis_url, leader_ttl=3)
    backend = open_store(config)
    try:
        os.killpg(replica.pid, signal.SIGTERM)
        fault = time.monotonic()

        def other_holder() -> bool:
            holder = backend.lock.holder("worker")
            return holder is not None and not holder.instance_id.endswith(f":{first}")

        wait_for(other_holder, 3, interval=0.01, message="another process leading 'worker'")
        took = time.monotonic() - fault
    finally:
        backend.close()
    print(f"worker election handed over {took:.3f} s after a group SIGTERM")
    assert took < 0.5, f"{took:.2f} s: the lease was not released at the signal"


def test_wait_mode_requeues_what_a_demoted_leader_prefetched(
    procs: Procs, broker_url: str, redis_url: str, tmp_path: Path
) -> None:
    """The leading worker process is paused past the ttl (not past the broker's 5 s
    heartbeat timeout, so Dramatiq itself does not take its messages back). When it
    resumes it has lost the lease: it finishes the body it was in, pauses its consumer
    and re-enqueues the message it had prefetched, which the new leader runs."""
    record = tmp_path / "record"
    env = app_env(broker_url, redis_url, record, BODY_SECONDS="0.3")
    env["dramatiq_queue_prefetch"] = "4"  # one running, up to three waiting in the process
    replicas = start(procs, env, "waiting")
    first = worker_leader(redis_url)
    send(broker_url, "waiting", 12)
    wait_for(lambda: len(records(record)) >= 3, 30, message="3 messages run")
    os.kill(first, signal.SIGSTOP)
    stopped = time.monotonic()
    wait_for(lambda: time.monotonic() > stopped + 4.0, 5)
    os.kill(first, signal.SIGCONT)
    wait_for(
        lambda: len({n for _, n, _, _ in records(record)}) == 12,
        40,
        message=lambda: f"all 12 run; so far {records(record)}",
    )
    rows = records(record)
    assert sorted(n for _, n, _, _ in rows) == list(range(12)), rows
    assert all(epoch is not None for *_, epoch in rows), rows
    by_epoch: dict[int | None, set[int]] = {}
    for _, _, pid, epoch in rows:
        by_epoch.setdefault(epoch, set()).add(pid)
    assert all(len(pids) == 1 for pids in by_epoch.values()), by_epoch
    logs = "".join(p.output() for p in replicas)
    assert "returning waiting" in logs, f"the demoted leader had nothing prefetched: {rows}"


def test_a_process_that_only_asks_never_campaigns(
    procs: Procs, broker_url: str, redis_url: str, tmp_path: Path
) -> None:
    """A web process imports the app and calls is_leader() 100 times: it holds no
    lease, so it answers False and never takes the election from the workers."""
    start(procs, app_env(broker_url, redis_url, tmp_path / "record"), "waiting")
    worker = worker_leader(redis_url)
    web = procs.spawn_python(
        "import time\n"
        "import tests.apps.dramatiq_app\n"
        "from celery_leader.dramatiq import current_epoch, is_leader\n"
        "answers = []\n"
        "for _ in range(100):\n"
        "    answers.append(is_leader())\n"
        "    time.sleep(0.02)\n"
        "print('leading', sum(answers), 'epoch', current_epoch(), flush=True)\n"
        "time.sleep(1)\n",
        env=app_env(broker_url, redis_url, tmp_path / "record"),
        cwd=REPO,
    )
    env = {**os.environ, "CELERY_LEADER_URL": redis_url}
    holders = set()
    while web.alive:
        status = subprocess.run(
            [sys.executable, "-m", "celery_leader", "status", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        elections = json.loads(status.stdout)["elections"]
        holders |= {e["holder"] for e in elections if e["holder"]}
    assert web.wait(5) == 0, web.output()
    assert "leading 0 epoch None" in web.output(), web.output()
    assert holders == {f"{HOST}:{worker}"}, holders


APP_MODULE = """
import dramatiq
from dramatiq.brokers.redis import RedisBroker
from celery_leader.dramatiq import LeaderMiddleware

broker = RedisBroker(url={broker_url!r})
broker.add_middleware(LeaderMiddleware(url={leader_url!r}, {options}))
dramatiq.set_broker(broker)
{actors}
"""


def write_app(path: Path, broker_url: str, leader_url: str, options: str, actors: str) -> None:
    path.write_text(
        APP_MODULE.format(
            broker_url=broker_url, leader_url=leader_url, options=options, actors=actors
        )
    )


@pytest.mark.parametrize(
    ("options", "actors", "error"),
    [
        ("ttl='soon'", "", "ttl= must be a number of seconds"),
        (
            "ttl=3",
            "@dramatiq.actor(leader_only=True)\ndef a(): ...\n@dramatiq.actor\ndef b(): ...\n",
            "queue 'default' mixes actor 'b'",
        ),
    ],
    ids=["bad-setting", "mixed-queue"],
)
def test_configuration_errors_are_one_line_under_the_dramatiq_cli(
    broker_url: str, redis_url: str, tmp_path: Path, options: str, actors: str, error: str
) -> None:
    write_app(tmp_path / "badapp.py", broker_url, redis_url, options, actors)
    run = subprocess.run(
        [str(DRAMATIQ), "badapp", "-p", "2", "--path", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 2, output
    assert "Traceback" not in output, output
    # One line per worker process that got that far (the first to fail stops the rest).
    lines = [line for line in output.splitlines() if error in line]
    assert lines and all("[CRITICAL] celery-leader: " in line for line in lines), output
    assert len(output.splitlines()) <= 2 + 2 * len(lines), output


def test_a_scheduler_with_no_entries_stays_out_of_the_election(
    procs: Procs, broker_url: str, redis_url: str, tmp_path: Path
) -> None:
    actors = "@dramatiq.actor(queue_name='only', leader_only=True)\ndef only(): ...\n"
    write_app(tmp_path / "noschedule.py", broker_url, redis_url, "ttl=3, scheduler=True", actors)
    env = {"PYTHONPATH": str(REPO)}
    standalone = procs.spawn_python(
        "import sys; from celery_leader.dramatiq.runner import standalone; "
        "sys.exit(standalone(['noschedule', '--path', '.']))",
        env=env,
        cwd=tmp_path,
    )
    embedded = procs.spawn_python(
        DRAMATIQ, "noschedule", "-p", "1", "--path", str(tmp_path), env=env, cwd=tmp_path
    )
    warning = r"\[WARNING\] celery-leader: no actor with a leader_schedule in noschedule"
    standalone.wait_for_line(warning, 60)
    embedded.wait_for_line(warning, 60)
    embedded.wait_for_line("ready for action", 60)
    config = LeaderConfig.from_env(env={}, leader_url=redis_url, leader_ttl=3)
    backend = open_store(config)
    try:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            assert backend.lock.holder("beat") is None, "a scheduler with no entries leads"
            time.sleep(0.05)
    finally:
        backend.close()
    standalone.signal(signal.SIGTERM)
    assert standalone.wait(10) == 0, standalone.output()
