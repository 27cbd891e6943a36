"""What ships and what the base install needs (imports: tests/test_imports.py).

The wheel must hold the package and nothing else; the sdist only files git
tracks; the repository no generated or backup files. The base install must
work without Celery or any store client.
"""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import tomllib

import celery_leader
from harness.venvs import clean_venv

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
    for extra in (
        "celery", "dramatiq", "redis", "postgres", "django", "metrics", "etcd", "mysql", "console"
    ):
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
    assert {"LICENSE", "CHANGELOG.md"} <= set(names)


# -- what PyPI shows -------------------------------------------------------------


def _metadata(dists: dict[str, Path]) -> str:
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        return wheel.read(
            next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        ).decode()


def test_wheel_ships_the_license_and_the_metadata_names_it(dists: dict[str, Path]) -> None:
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        licenses = [n for n in wheel.namelist() if "/licenses/" in n]
        assert [n.rsplit("/", 1)[1] for n in licenses] == ["LICENSE"]
        assert "MIT License" in wheel.read(licenses[0]).decode()
    metadata = _metadata(dists)
    assert "License-Expression: MIT" in metadata
    assert "License-File: LICENSE" in metadata


def test_metadata_has_urls_python_classifiers_and_the_one_version(dists: dict[str, Path]) -> None:
    metadata = _metadata(dists)
    urls = {
        line.split(": ", 1)[1].split(",")[0]
        for line in metadata.splitlines()
        if line.startswith("Project-URL: ")
    }
    assert urls == {"Documentation", "Source", "Changelog", "Issues"}
    for minor in (10, 11, 12, 13):
        assert f"Classifier: Programming Language :: Python :: 3.{minor}" in metadata
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"Version: {version}" in metadata
    # __version__ is read from the installed metadata, never written twice.
    assert celery_leader.__version__ == version
    assert f"## [{version}]" in (ROOT / "CHANGELOG.md").read_text()


def test_twine_check_passes(dists: dict[str, Path]) -> None:
    check = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dists.values())],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_readme_links_work_on_pypi() -> None:
    """The README is the PyPI page, where a relative link leads nowhere."""
    links = re.findall(r"\]\(([^)]+)\)", (ROOT / "README.md").read_text())
    assert links
    assert [link for link in links if not link.startswith("https://")] == []


@pytest.mark.slow
def test_the_wheel_runs_the_quickstart_in_a_clean_venv(
    dists: dict[str, Path], tmp_path: Path
) -> None:
    """What a user gets from PyPI: the built wheel, its extras, nothing from the checkout."""
    python, names = clean_venv(tmp_path, f"{dists['wheel']}[celery,django]")
    assert {"celery-leader", "celery", "kombu", "redis", "django"} <= names, names
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "PYTHON"))}
    # From tmp_path, so that celery_leader comes from the venv, not the checkout.
    run = subprocess.run(
        [python, str(ROOT / "example_project" / "quickstart.py"), "--short"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"^\d+ slots, 0 sent twice$", run.stdout, re.MULTILINE), run.stdout


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
from celery_leader.backends import open_store

config = LeaderConfig.from_mapping({"leader_url": "memory://"})
lease = Lease.from_config("e", config, open_store(config).lock)
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
        open_store(LeaderConfig.from_mapping({"leader_url": url}))
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


def test_the_install_page_lists_the_floors_pyproject_declares() -> None:
    """docs/install.md's table of oldest versions is pyproject.toml's, which the matrix tests."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    declared = {}
    for requirement in (r for group in extras.values() for r in group):
        match = re.fullmatch(r"([\w-]+)(?:\[[\w,]+\])?>=([\d.]+)", requirement)
        assert match, requirement
        declared[match[1]] = match[2]
    page = (ROOT / "docs" / "install.md").read_text()
    row = re.compile(r"^\| ([\w-]+)(?: \([\w-]+\))? \| ([\d.]+)[^|]*\|", re.MULTILINE)
    listed = dict(row.findall(page))
    assert len(listed) >= 8, f"the table of oldest versions in docs/install.md: {listed}"
    for name, version in listed.items():
        assert version.startswith(declared[name]), (name, version, declared[name])


def test_the_matrix_names_tests_that_exist() -> None:
    """Every test id scripts/matrix.py runs in a cell is collected: a renamed test
    must not leave the matrix (and so CI) running nothing for that group."""
    source = (ROOT / "scripts" / "matrix.py").read_text()
    ids = re.findall(r'"(tests/test_\w+\.py::[^"]+)"', source.replace('"\n        "', ""))
    assert ids, "no test ids found in scripts/matrix.py"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", *ids],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
