"""The package imports one way: along the layer table of the architecture page, with no
cycles, no function-level imports, no private names, and no Celery in the store-free
core that Dramatiq users get.

Read from the source with :mod:`ast`, so nothing is imported and every
module counts, whatever extras are installed.
"""

from __future__ import annotations

import ast
import re
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


def _string_imports(name: str) -> list[tuple[int, str]]:
    """(line, module) for each package module that ``name`` loads by a string literal."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return _loaded_by_string(path.read_text(), package)


def _loaded_by_string(source: str, package: str) -> list[tuple[int, str]]:
    """(line, module) for each ``importlib.import_module("...")`` or ``__import__("...")``
    of a package module in ``source`` (of a module of ``package``): the layer table
    binds those as much as an import statement."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        function, first = node.func, node.args[0]
        called = getattr(function, "attr", getattr(function, "id", None))
        if called not in ("import_module", "__import__"):
            continue
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            continue  # a name computed at run time: the code that names it is checked
        target = first.value
        if target.startswith("."):  # relative to the package argument, which is ours
            dots = len(target) - len(target.lstrip("."))
            base = package.rsplit(".", dots - 1)[0] if dots > 1 else package
            target = f"{base}.{target[dots:]}".rstrip(".")
        if target == "celery_leader" or target.startswith("celery_leader."):
            found.append((node.lineno, target))
    return found


def test_string_imports_are_read_however_they_are_spelt() -> None:
    source = (
        "import importlib\n"
        "from importlib import import_module\n"
        'importlib.import_module("celery_leader.a")\n'
        'import_module(".b", __name__)\n'
        '__import__("celery_leader.c")\n'
        'importlib.import_module("json")\n'
        "importlib.import_module(name)\n"
        'import_module("..d", __name__)\n'
    )
    assert _loaded_by_string(source, "celery_leader.x") == [
        (3, "celery_leader.a"),
        (4, "celery_leader.x.b"),
        (5, "celery_leader.c"),
        (8, "celery_leader.d"),
    ]


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


#: Each framework, and the packages that come only with it, is imported by one subpackage
#: (and Celery by the beat replica program that testing/ runs in a process of its own).
FRAMEWORKS = {
    "celery_leader.celery": {"celery", "kombu", "click", "billiard", "django_celery_beat"},
    "celery_leader.dramatiq": {"dramatiq", "cronsim"},
}
OWN_PROGRAMS = {"celery_leader.testing.beat_replica": "celery_leader.celery"}


def test_each_framework_is_imported_by_its_own_subpackage_only() -> None:
    """Nothing outside celery/ imports Celery; nothing outside dramatiq/ imports Dramatiq."""
    assert "celery_leader.celery.beat" in MODULES and "celery_leader.schedule" in MODULES
    for owner, names in FRAMEWORKS.items():
        for name in MODULES:
            if name == owner or name.startswith(owner + ".") or OWN_PROGRAMS.get(name) == owner:
                continue
            assert not (_third_party_imports(name) & names), f"{name} imports {names}"


#: The layer table of the contributors' architecture page, read by the tests below.
ARCHITECTURE = Path(__file__).parent.parent / "docs" / "architecture.md"


def _layers() -> list[tuple[list[str], list[str]]]:
    """(modules of the layer, what it may import) for each row of the doc's layer table."""
    text = ARCHITECTURE.read_text()
    table = text[text.index("| layer | may import |") :].split("\n\n")[0]
    rows = []
    for line in table.splitlines()[2:]:
        layer, allowed = line.strip("|").split("|")
        rows.append((re.findall(r"`([^`]+)`", layer), re.findall(r"`([^`]+)`", allowed)))
    assert rows, "the layer table has no rows"
    return rows


def _short(name: str) -> str:
    """A module's name as the table writes it: relative to the package."""
    return name.removeprefix("celery_leader.") if name != "celery_leader" else name


def _covers(entry: str, short: str) -> bool:
    """Whether table entry ``entry`` names module ``short`` or a package holding it."""
    return short == entry or short.startswith(entry + ".")


def _layer_of(short: str, layers: list[tuple[list[str], list[str]]]) -> int | None:
    """Index of the row naming ``short`` most closely (the longest matching entry)."""
    best: tuple[int, int] | None = None
    for index, (names, _) in enumerate(layers):
        for entry in names:
            if _covers(entry, short) and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    return None if best is None else best[1]


def test_every_module_has_a_row_in_the_layer_table_and_every_row_a_module() -> None:
    layers = _layers()
    shorts = [_short(name) for name in MODULES]
    assert [s for s in shorts if _layer_of(s, layers) is None] == []
    for names, allowed in layers:
        for entry in names + allowed:
            assert any(_covers(entry, s) for s in shorts), f"the table names {entry}: no module"


def test_every_import_follows_the_layer_table_row_by_row() -> None:
    """A module imports only from its own layer and the layers its row names."""
    layers = _layers()
    wrong = []
    for name in MODULES:
        own = _layer_of(_short(name), layers)
        assert own is not None
        names, allowed = layers[own]
        targets = [t for _, t, _ in _imports(name)] + [t for _, t in _string_imports(name)]
        for target in targets:
            short = _short(target)
            if not any(_covers(entry, short) for entry in names + allowed):
                wrong.append(f"{_short(name)} imports {short}")
    assert not wrong, "not allowed by the layer table of docs/architecture.md: " + "; ".join(wrong)


#: What no store module imports: the frameworks and Django (a store is chosen for
#: Django by the Django integration, which hands the store its connection settings).
STORE_FORBIDDEN = {
    "celery",
    "kombu",
    "click",
    "billiard",
    "django_celery_beat",
    "dramatiq",
    "django",
}
#: The only package modules a store module imports, besides the stores themselves.
STORE_BELOW = ("exceptions", "_urls", "clock", "collector")


def test_the_store_layer_imports_no_framework_scheduler_or_settings() -> None:
    """Stores know records, never what the records are for: no Celery, Dramatiq, Django
    or kombu, and nothing of the scheduler, the elector or the settings."""
    wrong = []
    for name in MODULES:
        if not _covers("backends", _short(name)):
            continue
        targets = [t for _, t, _ in _imports(name)] + [t for _, t in _string_imports(name)]
        ours = {_short(t) for t in targets}
        above = {
            t for t in ours if not _covers("backends", t) and t.split(".")[0] not in STORE_BELOW
        }
        wrong.extend(f"{_short(name)} imports {t}" for t in sorted(above))
        wrong.extend(
            f"{_short(name)} imports {t}"
            for t in sorted(_third_party_imports(name) & STORE_FORBIDDEN)
        )
    assert not wrong, "; ".join(wrong)
