"""``leader run``: a command on one replica only, under faults, with real processes.

Three ``python -m celery_leader run`` replicas on one Redis wrap a child that
records its lifetime every 50 ms (:mod:`harness.singleton`). The leading
replica is SIGKILLed, paused past the ttl and cut off from the store; the
children's lifetimes must never overlap and nothing may outlive the runners.
``benchmarks/singleton.py`` runs 20 faults on three stores and single-beat.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from celery_leader.run import guard
from harness.groups import group_alive
from harness.procs import Proc, Procs
from harness.servers import RedisServer, free_port
from harness.singleton import Fleet, alive, lifetimes, overlaps, wait_until
from harness.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timing]

TTL = 2.0
GRACE = 0.3


def _run(*args: str, url: str = "redis://127.0.0.1:1/0") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery_leader", "run", *args],
        env={"PATH": "/usr/bin:/bin", "CELERY_LEADER_URL": url},
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--election", "x"], "no command to run"),
        (["--election", "x", "--", "/nonexistent/cmd"], "cannot execute '/nonexistent/cmd'"),
        (["--election", "x", "--url", "nosuch://h", "--", "true"], "--url has unknown scheme"),
        (["--election", "x", "--ttl", "2", "--grace", "5", "--", "true"], "--grace must be"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_campaigning(args: list[str], says: str) -> None:
    # The store URL names a closed port: campaigning would log connection errors.
    result = _run(*args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and says in result.stderr, result.stderr
    assert result.stdout == ""


def test_a_taken_health_port_is_one_line_and_exit_2(redis_url: str) -> None:
    with socket.create_server(("0.0.0.0", 0)) as taken:
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "celery_leader", "run", "--election", "x", "--", "true"],
            env={"PATH": "/usr/bin:/bin", "CELERY_LEADER_URL": redis_url}
            | {"CELERY_LEADER_HEALTH_PORT": str(port)},
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode == 2
    assert result.stderr == f"Error: leader_health_port {port}: cannot listen: " + (
        "[Errno 98] Address already in use\n"
    )


def test_no_overlap_no_orphans_under_faults(
    redis_server: RedisServer, redis_url: str, tmp_path: Path
) -> None:
    fleet = Fleet(
        "leader",
        [redis_server.port],
        lambda proxies: proxies[0].url_for(redis_url),
        tmp_path,
        ttl=TTL,
        grace=GRACE,
    )
    try:
        fleet.top_up()
        outcomes = [fleet.fault(fault) for fault in ("sigkill", "sigstop", "cut", "sigkill")]
        _, life = fleet.steady()
        assert life.epoch.isdigit(), "the child gets LEADER_EPOCH"
        fleet.stop()
        # The runners exit after their children: nothing is left.
        assert [r.proc.popen.returncode for r in fleet.runners] == [0, 0, 0]
        assert wait_until(lambda: not fleet.orphans(), 1.0) is not None, fleet.orphans()
    finally:
        fleet.close()
    lives = lifetimes(fleet.records)
    assert overlaps(lives) == []
    # Epochs grow with every child: each ran under a term of its own or a later one.
    epochs = [int(life.epoch) for life in lives]
    assert epochs == sorted(epochs)
    for outcome in outcomes:
        assert outcome.old_gone is not None and outcome.new_start is not None, outcome
        if outcome.fault == "sigkill":
            assert outcome.old_gone < 0.5, outcome
            assert outcome.new_start < 1.0, outcome
        else:
            # The old child is stopped before the lease can pass: within the ttl.
            assert outcome.old_gone < TTL, outcome
            assert outcome.new_start < TTL + 1.0, outcome


def test_signal_stops_the_child_then_hands_over_at_once(
    redis_server: RedisServer, redis_url: str, tmp_path: Path
) -> None:
    fleet = Fleet(
        "leader",
        [redis_server.port],
        lambda p: p[0].url_for(redis_url),
        tmp_path,
        TTL,
        GRACE,
        count=2,
    )
    try:
        fleet.top_up()
        runner, old = fleet.steady()
        runner.proc.signal(signal.SIGTERM, group=False)
        assert runner.proc.wait(timeout=5) == 0
        assert not alive(old.pid)
        fleet.runners.remove(runner)
        _, new = fleet.steady()
        # Released, not expired: the follower starts well within the ttl.
        assert new.start - old.last < 1.0
    finally:
        fleet.close()
    assert overlaps(lifetimes(fleet.records)) == []


def _runner(procs: Procs, url: str, *args: str, env: dict[str, str] | None = None) -> Proc:
    return procs.spawn_python(
        "import sys; from celery_leader.__main__ import main; sys.exit(main())",
        "run",
        "--election",
        "restarts",
        "--url",
        url,
        "--ttl",
        str(TTL),
        *args,
        env=env,
    )


def test_restart_never_resigns_with_the_commands_status(
    procs: Procs, redis_url: str, tmp_path: Path
) -> None:
    runner = _runner(procs, redis_url, "--", "sh", "-c", "exit 7")
    assert runner.wait(timeout=15) == 7
    status = subprocess.run(
        [sys.executable, "-m", "celery_leader", "status", "restarts"],
        env={"PATH": "/usr/bin:/bin", "CELERY_LEADER_URL": redis_url},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert status.returncode == 3, status.stdout  # released: nobody leads


def test_restart_on_failure_starts_a_failed_command_again(
    procs: Procs, redis_url: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    script = f'echo "$LEADER_ELECTION $LEADER_EPOCH" >> {runs}; exit 1'
    runner = _runner(procs, redis_url, "--restart", "on-failure", "--", "sh", "-c", script)
    wait_for(lambda: runs.exists() and len(runs.read_text().splitlines()) >= 2, 15)
    runner.signal(signal.SIGTERM, group=False)
    assert runner.wait(timeout=10) == 0
    first, second = runs.read_text().splitlines()[:2]
    assert first == second and first.startswith("restarts "), "one term, restarted within it"


def test_health_endpoint_of_runners(procs: Procs, redis_url: str) -> None:
    ports = [free_port(), free_port()]
    runners = [
        _runner(
            procs,
            redis_url,
            "--",
            "sleep",
            "60",
            env={"CELERY_LEADER_HEALTH_PORT": str(port), "CELERY_LEADER_INSTANCE_ID": f"r{i}"},
        )
        for i, port in enumerate(ports)
    ]
    leader = wait_for(lambda: next((r for r in runners if "leads 'restarts'" in r.output()), 0), 15)
    name = f"r{runners.index(leader)}"
    for runner in runners:
        runner.wait_for_line("campaigns for", timeout=15)  # serving by then
    for port in ports:
        # Leader and follower are both healthy, and both know who leads.
        url = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as reply:
            assert reply.status == 200 and reply.read().startswith(b"OK: ")
        seen = wait_for(
            lambda: _json(f"{url}/leader")["holder"] == name and _json(f"{url}/leader"), 5
        )
        assert seen["election"] == "restarts" and seen["epoch"] > 0 and seen["since"] > 0
        assert seen["this_process_leads"] == (port == ports[runners.index(leader)])


def _json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return dict(json.loads(reply.read()))


def test_celery_leader_run_takes_the_apps_settings(redis_url: str) -> None:
    celery = [sys.executable, "-m", "celery", "-A", "tests.apps.beat_app", "leader", "run"]
    command = ["sh", "-c", 'echo "$LEADER_ELECTION"; exit 4']
    result = subprocess.run(
        [*celery, "--election", "from-app", "--", *command],
        env={"PATH": "/usr/bin:/bin", "BROKER_URL": redis_url, "LEADER_URL": redis_url},
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 4, result.stderr
    assert result.stdout == "from-app\n"


def test_kill_9_of_the_runner_takes_the_whole_group_down(procs: Procs, redis_url: str) -> None:
    # The command forks a grandchild; both write their pid, then sleep.
    script = 'sleep 300 & echo "$!" > "$0.grandchild"; echo "$$" > "$0.child"; wait'
    pids = Path(procs.log_dir) / "pids"
    runner = _runner(procs, redis_url, "--", "sh", "-c", script, str(pids))
    child_file, grandchild_file = Path(f"{pids}.child"), Path(f"{pids}.grandchild")
    wait_for(lambda: child_file.exists() and grandchild_file.exists(), 15)
    wait_for(lambda: child_file.read_text().strip() and grandchild_file.read_text().strip(), 5)
    child, grandchild = int(child_file.read_text()), int(grandchild_file.read_text())
    assert alive(child) and alive(grandchild)
    runner.signal(signal.SIGKILL, group=False)
    gone = wait_until(lambda: not alive(child) and not alive(grandchild), 2.0)
    assert gone is not None and gone < 0.5, gone


def test_the_guard_signals_its_commands_group_only_while_the_command_is_unreaped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guard kills what its command left in its group, after the command exits and
    before reaping it: a reaped pid is another process's soon (a killpg of it hit another
    test process's PostgreSQL, see CONTRIBUTING "Known causes"), an unreaped one is not."""
    signalled: list[tuple[int, bool]] = []
    killpg = guard.os.killpg

    def recording(pgid: int, sig: int) -> None:
        flags = guard.os.WEXITED | guard.os.WNOHANG | guard.os.WNOWAIT
        try:
            unreaped = guard.os.waitid(guard.os.P_PID, pgid, flags) is not None
        except ChildProcessError:
            unreaped = False  # reaped: not our child any more
        signalled.append((sig, unreaped))
        killpg(pgid, sig)

    monkeypatch.setattr(guard.os, "killpg", recording)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        runner = guard.Guard(
            theirs, time.monotonic() + 60, 5.0, 1.0, ["sh", "-c", "sleep 60 & exit 3"]
        )
        assert runner.run() == 3
    assert signalled == [(signal.SIGKILL, True)], "once, the command exited, not reaped"
    group = runner.child.pid
    wait_for(lambda: not group_alive(group), 5, message="the command's orphan outlived it")
