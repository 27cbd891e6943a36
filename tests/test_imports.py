"""The package imports one way: no cycles, no function-level imports, no private names,
and no Celery in the store-free core that Dramatiq users get.

Read from the source with :mod:`ast`, so nothing is imported and every
module counts, whatever extras are installed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import celery_leader

PACKAGE = Path(celery_leader.__file__).parent

#: The worker side, lowest layer first: each imports only from layers before it.
WORKER_LAYERS = [
    "celery.deadline_table",
    "celery.leadership",
    "celery.routing",
    "celery.decorators",
    "celery.worker",
]


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str) -> list[tuple[ast.ImportFrom, str, bool]]:
    """(node, imported module, at module level) for each import of a package module."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = {id(node) for node in tree.body} | {
        id(inner)
        for node in tree.body
        if isinstance(node, (ast.Try, ast.If))
        for inner in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        target = f"{base}.{node.module}" if node.module else base
        targets = [f"{target}.{alias.name}" for alias in node.names]
        targets = [t for t in targets if t in MODULES] or [target]
        found.extend((node, t, id(node) in top) for t in targets)
    return found


def test_no_import_cycle_in_the_package() -> None:
    graph = {name: {t for _, t, top in _imports(name) if top} for name in MODULES}
    # A package's __init__ importing its own submodules is not a cycle back.
    graph = {n: {t for t in ts if not n.startswith(t + ".") or t == n} for n, ts in graph.items()}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError(f"import cycle: {' -> '.join([*path, name])}")
        if name in done:
            return
        for target in sorted(graph.get(name, ())):
            visit(target, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_no_function_level_import_of_the_package() -> None:
    late = [
        f"{name}:{node.lineno}" for name in MODULES for node, _, top in _imports(name) if not top
    ]
    assert late == []


def test_worker_side_imports_point_one_way() -> None:
    for index, layer in enumerate(WORKER_LAYERS):
        name = f"celery_leader.{layer}"
        for _, target, _ in _imports(name):
            short = target.removeprefix("celery_leader.")
            if short in WORKER_LAYERS:
                assert WORKER_LAYERS.index(short) < index, f"{layer} imports {short}"


def test_no_module_uses_another_ones_private_names() -> None:
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        siblings = set()
        for node, target, _ in _imports(name):
            for alias in node.names:
                assert not alias.name.startswith("_") or alias.name == "__version__", (
                    f"{name} imports {alias.name} from {target}"
                )
                if target in MODULES and target.rpartition(".")[2] == alias.name:
                    siblings.add(alias.asname or alias.name)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in siblings
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                raise AssertionError(f"{name}:{node.lineno} uses {node.value.id}.{node.attr}")


def _third_party_imports(name: str) -> set[str]:
    """Top-level names of the absolute imports of one package module."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


#: Each framework, and the packages that come only with it, is imported by one subpackage.
FRAMEWORKS = {
    "celery_leader.celery": {"celery", "kombu", "click", "billiard", "django_celery_beat"},
    "celery_leader.dramatiq": {"dramatiq", "cronsim"},
}


def test_each_framework_is_imported_by_its_own_subpackage_only() -> None:
    """Nothing outside celery/ imports Celery; nothing outside dramatiq/ imports Dramatiq."""
    assert "celery_leader.celery.beat" in MODULES and "celery_leader.schedule" in MODULES
    for owner, names in FRAMEWORKS.items():
        for name in MODULES:
            if name == owner or name.startswith(owner + "."):
                continue
            assert not (_third_party_imports(name) & names), f"{name} imports {names}"


def test_the_slot_protocol_knows_no_framework() -> None:
    """The schedule package imports neither framework subpackage."""
    for name in MODULES:
        if name.startswith("celery_leader.schedule"):
            for _, target, _ in _imports(name):
                assert not target.startswith(("celery_leader.celery", "celery_leader.dramatiq")), (
                    f"{name} imports {target}"
                )
