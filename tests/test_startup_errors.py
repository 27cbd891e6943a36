"""Bad settings end every process at start, in one line on stderr, never a traceback.

Real ``celery beat``, ``celery worker``, ``celery leader``, ``dramatiq`` and
``python -m`` processes, each started with one bad setting: an unknown store
scheme, ``leader_ttl = 0``, ``django://`` on SQLite, and a store that cannot be
built (a directory under ``/proc``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_text import quoted_messages

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
DRAMATIQ_APP = "tests.apps.settings_dramatiq"

#: Each bad setting, as environment variables, and what its one line must say.
BAD = {
    "unknown-scheme": ({"CELERY_LEADER_URL": "nope://x"}, "has unknown scheme 'nope'"),
    "zero-ttl": (
        {"CELERY_LEADER_URL": "memory://", "CELERY_LEADER_TTL": "0"},
        "must be a number of seconds greater than 0 (got '0')",
    ),
    "unbuildable-store": (
        {"CELERY_LEADER_URL": "file:///proc/nope"},
        "'file:///proc/nope': cannot create the directory",
    ),
}

DJANGO_SQLITE = """\
SECRET_KEY = "test"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}}
CELERY_LEADER_URL = "django://default"
"""


def run(args: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    full = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "DJANGO_"))},
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(cwd)]),
        # Celery warns on stderr about a worker run as root (as in CI containers).
        "C_FORCE_ROOT": "1",
        "PYTHONWARNINGS": "ignore:You're running the worker with superuser",
        **env,
    }
    return subprocess.run(
        args, env=full, cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def assert_one_line(proc: subprocess.CompletedProcess[str], expected: str) -> str:
    lines = proc.stderr.splitlines()
    assert proc.returncode in (1, 2), proc.returncode
    assert len(lines) == 1, f"stderr is not one line:\n{proc.stderr}"
    assert "Traceback" not in proc.stdout + proc.stderr
    assert expected in lines[0], lines[0]
    return lines[0]


def beat(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return run(
        [str(BIN / "celery"), "-A", "tests.apps.settings_app", "beat", "-s", str(tmp_path / "s")],
        env,
        cwd=tmp_path,
    )


@pytest.mark.parametrize("case", BAD)
def test_celery_beat(case: str, tmp_path: Path) -> None:
    env, expected = BAD[case]
    line = assert_one_line(beat(env, tmp_path), expected)
    assert line.startswith("Error: leader_"), line
    if case == "unbuildable-store":
        assert line in quoted_messages(), "docs/configuration.md quotes it"


def test_celery_beat_django_on_sqlite_names_the_django_setting(tmp_path: Path) -> None:
    (tmp_path / "sqlite_settings.py").write_text(DJANGO_SQLITE)
    proc = beat({"DJANGO_SETTINGS_MODULE": "sqlite_settings"}, tmp_path)
    line = assert_one_line(proc, "uses ENGINE 'django.db.backends.sqlite3'")
    assert line.startswith("Error: CELERY_LEADER_URL 'django://default'"), line
    assert line in quoted_messages(), "docs/configuration.md quotes it"


@pytest.mark.parametrize("case", BAD)
def test_celery_worker(case: str, tmp_path: Path) -> None:
    env, expected = BAD[case]
    proc = run(
        [str(BIN / "celery"), "-A", "tests.apps.settings_app", "worker", "-P", "solo"],
        env,
        cwd=tmp_path,
    )
    assert_one_line(proc, expected)


@pytest.mark.parametrize("case", BAD)
def test_dramatiq_standalone_scheduler(case: str, tmp_path: Path) -> None:
    env, expected = BAD[case]
    proc = run([sys.executable, "-m", "celery_leader.dramatiq", DRAMATIQ_APP], env)
    line = assert_one_line(proc, expected)
    # The environment variable, as the user spelled it.
    assert "CELERY_LEADER_" in line, line


def test_dramatiq_command(tmp_path: Path) -> None:
    """``dramatiq`` logs the error as one CRITICAL line per process and exits 2."""
    env, _ = BAD["unbuildable-store"]
    proc = run([str(BIN / "dramatiq"), DRAMATIQ_APP, "--processes", "1", "--threads", "1"], env)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "[celery_leader" in line]
    assert len(errors) == 1, proc.stderr
    assert "[CRITICAL] celery-leader: CELERY_LEADER_URL 'file:///proc/nope'" in errors[0]


@pytest.mark.parametrize("case", ["unknown-scheme", "zero-ttl"])
def test_leader_clis(case: str, tmp_path: Path) -> None:
    env, expected = BAD[case]
    celery = run([str(BIN / "celery"), "-A", "tests.apps.settings_app", "leader", "status"], env)
    assert assert_one_line(celery, expected).startswith("Error: leader_")
    plain = run([sys.executable, "-m", "celery_leader", "status"], env)
    assert assert_one_line(plain, expected).startswith("Error: CELERY_LEADER_")
    assert celery.returncode == plain.returncode == 2


def test_misspelt_setting_is_warned_about_with_the_closest_name(tmp_path: Path) -> None:
    env = {"CELERY_LEADER_URL": "memory://", "CELERY_LEADER_TTL": "0", "CELERY_LEADER_TLL": "5"}
    proc = beat(env, tmp_path)
    plain = run([sys.executable, "-m", "celery_leader", "status"], env)
    warnings = {
        line
        for line in (proc.stderr + plain.stderr).splitlines()
        if line.startswith("celery-leader: unknown setting")
    }
    assert warnings == {
        "celery-leader: unknown setting leader_tll is ignored; did you mean leader_ttl?",
        "celery-leader: unknown setting CELERY_LEADER_TLL is ignored; did you mean "
        "CELERY_LEADER_TTL?",
    }
    assert warnings <= quoted_messages(), "docs/configuration.md quotes them"
