"""What ships and what the base install needs (imports: tests/test_imports.py).

The wheel must hold the package and nothing else; the sdist only files git
tracks; the repository no generated or backup files. The base install must
work without Celery or any store client.
"""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "celery_leader"

#: Names of files that are produced by running things, or left behind by editors
#: and patch tools: never tracked, never shipped.
GENERATED = (
    "*.orig",
    "*.rej",
    "*.bak",
    "*~",
    "*.pyc",
    "*.pyo",
    "*.log",
    "*.sqlite3",
    "*.exchange",
    "*.msg",
    "*.lock",
    "celerybeat-schedule*",
    "__pycache__",
    ".data",
    "site",
    "dist",
    "build",
)


def _generated(path: str) -> bool:
    return any(fnmatch.fnmatch(part, pattern) for part in path.split("/") for pattern in GENERATED)


def _tracked() -> set[str]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    return set(out.splitlines())


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "-q", "--sdist", "--wheel", "-o", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    return {
        "wheel": next(out.glob("*.whl")),
        "sdist": next(out.glob("*.tar.gz")),
    }


def test_repository_tracks_no_generated_or_backup_files() -> None:
    assert sorted(p for p in _tracked() if _generated(p)) == []


def test_wheel_ships_exactly_the_tracked_package_files(dists: dict[str, Path]) -> None:
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        names = [n for n in wheel.namelist() if ".dist-info/" not in n]
        metadata = wheel.read(
            next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        ).decode()
    tracked = {p for p in _tracked() if p.startswith("celery_leader/")}
    assert sorted(names) == sorted(tracked)
    assert "celery_leader/py.typed" in names
    # The base install pulls in nothing; Celery and the store clients are extras.
    assert [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")] == [
        line
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "; extra ==" in line
    ]
    for extra in ("celery", "dramatiq", "redis", "postgres", "django", "metrics", "etcd", "mysql"):
        assert f"Provides-Extra: {extra}" in metadata


def test_sdist_ships_only_tracked_files(dists: dict[str, Path]) -> None:
    with tarfile.open(dists["sdist"]) as sdist:
        names = [m.name.split("/", 1)[1] for m in sdist.getmembers() if m.isfile()]
    # Written by the build backend itself.
    made_by_build = {"PKG-INFO", "pyproject.toml"}
    tracked = _tracked()
    assert sorted(n for n in names if n not in tracked and n not in made_by_build) == []
    assert sorted(n for n in names if _generated(n)) == []
    assert "celery_leader/__init__.py" in names
    assert "tests/test_packaging.py" in names


# -- the base install ---------------------------------------------------------

_WITHOUT_EXTRAS = """
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    # As if only the base install were there: no Celery, no store clients.
    names = {"celery", "kombu", "billiard", "click", "redis", "psycopg", "pymysql", "django",
             "django_celery_beat", "dramatiq", "prometheus_client"}
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Block())
for name in list(sys.modules):
    if name.split(".")[0] in Block.names:
        del sys.modules[name]

import celery_leader
from celery_leader import LeaderConfig, Lease, MissingExtra
from celery_leader.backends import create_backend

config = LeaderConfig.from_mapping({"leader_url": "memory://"})
lease = Lease.from_config("e", config, create_backend(config))
lease.start()
lease.stop()
print("base ok")
for name in ("LeaderScheduler", "leader_only"):
    try:
        getattr(celery_leader, name)
    except MissingExtra as exc:
        print(name, "->", exc)
for url in ("redis://127.0.0.1:1/0", "postgresql://u@127.0.0.1:1/db", "mysql://u@127.0.0.1:1/db"):
    try:
        create_backend(LeaderConfig.from_mapping({"leader_url": url}))
    except MissingExtra as exc:
        print(url.split(":")[0], "->", exc)
"""


def test_base_install_works_without_celery_or_store_clients() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRAS], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "base ok"
    assert len(lines) == 6, lines
    extras = ("celery", "celery", "redis", "postgres", "mysql")
    for line, extra in zip(lines[1:], extras, strict=True):
        assert line.endswith(f"pip install 'celery-leader[{extra}]'"), line
        assert "\n" not in line
