"""What ships, what the base install needs, and how the modules depend on each other.

The wheel must hold the package and nothing else; the sdist only files git
tracks; the repository no generated or backup files. The base install must
work without Celery or any store client, and the package's imports must not
form a cycle.
"""

from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
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
    for extra in ("celery", "dramatiq", "redis", "postgres", "django", "metrics"):
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
    names = {"celery", "kombu", "billiard", "click", "redis", "psycopg", "django",
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
for url in ("redis://127.0.0.1:1/0", "postgresql://u@127.0.0.1:1/db"):
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
    assert len(lines) == 5, lines
    for line, extra in zip(lines[1:], ("celery", "celery", "redis", "postgres"), strict=True):
        assert line.endswith(f"pip install 'celery-leader[{extra}]'"), line
        assert "\n" not in line


# -- imports point one way ----------------------------------------------------


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except those only for the type checker."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if _type_checking_only(child):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            stack.append(child)


def _internal_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _imports(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            base = f"{base}.{node.module}" if node.level and node.module else node.module or base
            # "from pkg import sub" imports the submodule when there is one.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        found.update(t for t in targets if t in modules and t != name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return result


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _internal_imports(name, path, modules) for name, path in modules.items()}


def test_no_import_cycle_inside_the_package() -> None:
    graph = _graph()
    # The walk must see the package's real edges, or it proves nothing.
    assert "celery_leader.lease" in graph["celery_leader.beat"]
    assert "celery_leader.backends.base" in graph["celery_leader.backends.memory"]
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_store_free_core_does_not_import_celery() -> None:
    """config, lease, exceptions and backends serve Dramatiq too: no Celery there."""
    core = [
        name
        for name in _modules()
        if name.split(".")[1:2] in (["config"], ["lease"], ["exceptions"], ["_urls"], ["backends"])
    ]
    assert "celery_leader.lease" in core
    for name in core:
        tree = ast.parse(_modules()[name].read_text())
        for node in _imports(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            assert not any(n.split(".")[0] in ("celery", "kombu", "click") for n in names), name
