"""The example Django project, its quickstart, and django-celery-beat behind the lease."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from celery_leader.backends import create_backend
from celery_leader.config import LeaderConfig
from harness.procs import Proc, Procs
from harness.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "example_project"
CELERY_MAIN = "from celery.__main__ import main; main()"
SCHEDULER = "celery_leader.contrib.django:LeaderDatabaseScheduler"


def _env(data: Path, **extra: str) -> dict[str, str]:
    return {
        "PYTHONPATH": f"{PROJECT}{os.pathsep}{ROOT}",
        "DJANGO_SETTINGS_MODULE": "proj.settings",
        "DEMO_DATA": str(data),
        **extra,
    }


def _manage(data: Path, *argv: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PROJECT / "manage.py"), *argv],
        env={**os.environ, **_env(data, **extra)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_manage_check_and_migrate_on_sqlite(tmp_path: Path) -> None:
    check = _manage(tmp_path, "check")
    assert check.returncode == 0, check.stderr
    assert "no issues" in check.stdout
    migrate = _manage(tmp_path, "migrate", "--no-input")
    assert migrate.returncode == 0, migrate.stderr
    assert (tmp_path / "db.sqlite3").exists()
    # The example app's migration put a periodic task in django-celery-beat's table.
    shell = _manage(
        tmp_path,
        "shell",
        "-c",
        "from django_celery_beat.models import PeriodicTask;"
        "print(list(PeriodicTask.objects.values_list('task', flat=True)))",
    )
    assert "ticker.tasks.db_tick" in shell.stdout, shell.stderr


@pytest.mark.slow
@pytest.mark.timing
def test_quickstart_short_mode() -> None:
    """The README's first command, in the short mode CI runs: exits 0 with a clean tally."""
    run = subprocess.run(
        [sys.executable, str(PROJECT / "quickstart.py"), "--short"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    assert re.search(r">>> SIGKILL to the leader beat-\d", out), out
    assert re.search(r">>> SIGTERM to the leader beat-\d", out), out
    took = [float(x) for x in re.findall(r"took over in ([\d.]+) s", out)]
    assert len(took) == 2, out
    # The file store hands over as soon as the kernel drops the dead holder's lock.
    assert max(took) < 0.5, out
    assert "epochs seen: [1, 2, 3]" in out, out
    tally = re.search(r"^(\d+) slots, (\d+) sent twice$", out, re.M)
    assert tally is not None, out
    assert int(tally[1]) > 10 and tally[2] == "0", out


def _published(client: redis.Redis) -> list[dict[str, object]]:
    """Headers of every message waiting in the broker's ``celery`` queue."""
    return [json.loads(raw)["headers"] for raw in client.lrange("celery", 0, -1)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "database", ["sqlite", pytest.param("mariadb", marks=pytest.mark.mariadb)]
)
def test_database_scheduler_survives_sigkill_without_duplicates(
    tmp_path: Path, redis_url: str, procs: Procs, database: str, request: pytest.FixtureRequest
) -> None:
    """3 replicas of LeaderDatabaseScheduler: on SQLite with a Redis store, and on MariaDB
    with the project's own database as the store (``django://default``). Kill the leader."""
    broker_url = redis_url.rsplit("/", 1)[0] + "/1"
    extra = {
        "CELERY_LEADER_URL": redis_url,
        "CELERY_BROKER_URL": broker_url,
        "CELERY_LEADER_TTL": "2",
        "DEMO_EVERY": "1",
    }
    store_url = redis_url
    if database == "mariadb":
        store_url = request.getfixturevalue("mariadb_url")
        extra["DJANGO_MYSQL"] = store_url.removeprefix("mariadb://")
        extra["CELERY_LEADER_URL"] = "django://default"
    assert _manage(tmp_path, "migrate", "--no-input", **extra).returncode == 0
    # django-celery-beat's own table gets an entry every second too.
    shell = _manage(
        tmp_path,
        "shell",
        "-c",
        "from django_celery_beat.models import IntervalSchedule, PeriodicTask;"
        "every, _ = IntervalSchedule.objects.get_or_create(every=1, period='seconds');"
        "PeriodicTask.objects.filter(task='ticker.tasks.db_tick').update(interval=every)",
        **extra,
    )
    assert shell.returncode == 0, shell.stderr

    def beat(n: int) -> Proc:
        return procs.spawn_python(
            CELERY_MAIN,
            "-A", "proj", "beat", "-S", SCHEDULER, "-l", "info",
            env=_env(tmp_path, CELERY_LEADER_INSTANCE_ID=f"beat-{n}", **extra),
            cwd=PROJECT,
        )  # fmt: skip

    beats = {f"beat-{n}": beat(n) for n in (1, 2, 3)}
    client = redis.Redis.from_url(broker_url)
    wait_for(lambda: len(_published(client)) >= 6, 30, message="first publishes")
    epochs = {h["leader_epoch"] for h in _published(client)}
    assert len(epochs) == 1
    leader_epoch = epochs.pop()
    store = create_backend(LeaderConfig.from_mapping({"leader_url": store_url}))
    info = store.holder("beat")
    store.close()
    assert info is not None
    holder = info.instance_id
    killed = beats[holder]
    os.killpg(killed.pid, signal.SIGKILL)
    killed_at = time.monotonic()

    def new_epoch() -> bool:
        return any(h["leader_epoch"] != leader_epoch for h in _published(client))

    wait_for(new_epoch, 10, message="publishes under a new epoch")
    took = time.monotonic() - killed_at
    # ttl 2 s, then at most one 1 s period before the next slot falls due.
    assert took < 2 + 0.5 + 1 + 0.5, f"first publish of the new leader after {took:.2f}s"
    count_after = len(_published(client))
    wait_for(lambda: len(_published(client)) >= count_after + 6, 15, message="steady again")

    for name, proc in beats.items():
        if proc is not killed:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(15)
            assert "Traceback" not in proc.output(), f"{name}:\n{proc.output()}"

    slots = Counter(str(h["leader_slot"]) for h in _published(client))
    twice = {slot: n for slot, n in slots.items() if n > 1}
    assert not twice, f"slots sent twice: {twice}"
    tasks = {slot.partition("@")[0] for slot in slots}
    assert tasks == {"heartbeat", "db_tick every 5 s"}, tasks
