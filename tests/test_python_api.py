"""The plain-Python leadership API (``Leadership``, ``leader_loop``) on a real Redis,
and the example of docs/python-api.md run as two real processes."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from celery_leader import LeaderConfig, Leadership
from celery_leader.backends import HolderInfo
from harness.procs import Procs
from harness.waiting import wait_for

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "leader_thread.py"


def _config(url: str, instance: str) -> LeaderConfig:
    return LeaderConfig.from_env({}, leader_url=url, leader_ttl=2, leader_instance_id=instance)


def test_callbacks_epoch_and_hand_over(redis_url: str) -> None:
    events: list[tuple[str, str, object]] = []
    lock = threading.Lock()

    def recorder(name: str) -> dict[str, object]:
        def record(kind: str, value: object = None) -> None:
            with lock:
                events.append((name, kind, value))

        return {
            "on_started": lambda epoch: record("started", epoch),
            "on_stopped": lambda: record("stopped"),
            "on_new_leader": lambda holder: record(
                "new_leader", (holder.instance_id, holder.epoch)
            ),
        }

    first = Leadership("api", _config(redis_url, "a"), **recorder("a")).start()
    assert first.wait_until_leading(timeout=5)
    epoch = first.epoch
    assert epoch is not None and first.since is not None
    with Leadership("api", _config(redis_url, "b"), **recorder("b")) as second:
        assert not second.wait_until_leading(timeout=0.5)
        # The follower learns who leads.
        wait_for(lambda: ("b", "new_leader", ("a", epoch)) in events, 5)
        first.stop()
        assert first.epoch is None and not first.is_leader()
        assert second.wait_until_leading(timeout=2), "released: taken over well within the ttl"
        assert second.epoch is not None and second.epoch > epoch
        holder = second.holder
        assert isinstance(holder, HolderInfo) and holder.instance_id == "b"
    assert ("a", "started", epoch) in events
    assert events.index(("a", "started", epoch)) < events.index(("a", "stopped", None))
    assert ("b", "started", holder.epoch) in events
    assert events[-1] == ("b", "stopped", None), events


def test_the_documented_example_runs_the_loop_on_one_process(procs: Procs, redis_url: str) -> None:
    env = {"CELERY_LEADER_URL": redis_url, "CELERY_LEADER_TTL": "2"}
    a = procs.spawn_python(EXAMPLE, env={**env, "CELERY_LEADER_INSTANCE_ID": "a"})
    b = procs.spawn_python(EXAMPLE, env={**env, "CELERY_LEADER_INSTANCE_ID": "b"})
    leader = wait_for(lambda: next((p for p in (a, b) if "cleanup under" in p.output()), None), 15)
    follower = b if leader is a else a
    name = "a" if leader is a else "b"
    # The follower hears who leads and runs no cleanup.
    follower.wait_for_line(rf"leader is {name} \(epoch \d+\)", timeout=5)
    assert "cleanup under" not in follower.output()
    leader.signal(signal.SIGTERM, group=False)
    assert leader.wait(timeout=10) == 0
    follower.wait_for_line("cleanup under epoch", timeout=1.5)
