"""``pip install 'celery-leader[dramatiq,redis]'`` into a clean venv pulls in no Celery.

Slow: it builds the package and installs it with its dependencies (pip finds them
in this machine's local wheel cache; CI downloads them).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.venvs import clean_venv

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]

#: What the Dramatiq tests and the Dramatiq docs import.
IMPORTS = """
import celery_leader
import cronsim, dramatiq, redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from celery_leader.dramatiq import LeaderMiddleware, cron, current_epoch, every, is_leader
from celery_leader.dramatiq.runner import standalone
from celery_leader.dramatiq.scheduler import DramatiqScheduler
from celery_leader.backends import open_store
from celery_leader.settings.config import LeaderConfig
try:
    celery_leader.LeaderScheduler
except ImportError as exc:
    print("celery:", exc)
"""


def test_the_dramatiq_extra_installs_no_celery(tmp_path: Path) -> None:
    python, names = clean_venv(tmp_path, f"{REPO}[dramatiq,redis]")
    assert {"dramatiq", "cronsim", "redis", "celery-leader"} <= names, names
    assert not names & {"celery", "kombu", "billiard"}, names
    # Run from tmp_path so that the installed package is imported, not the checkout.
    imported = subprocess.run([python, "-c", IMPORTS], capture_output=True, text=True, cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == (
        "celery: celery-leader needs 'celery' for this, and it is not installed: "
        "pip install 'celery-leader[celery]'"
    ), imported.stdout
