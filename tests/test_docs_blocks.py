"""Every Python block of the README and docs is valid Python, and what it imports exists.

Blocks that need servers are run elsewhere (the README tour in
tests/test_readme_tour.py, the example projects in tests/test_testing_helpers.py);
here each block is parsed, and each of its imports runs, so a renamed or removed
name in any block a user would paste fails the suite.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_text import ROOT, code_blocks

PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
#: Modules of the user's own project, which the blocks stand for.
USERS_OWN = {"proj", "app", "some_package"}

BLOCKS = [
    pytest.param(block, id=f"{page}#{n}")
    for page in PAGES
    for n, block in enumerate(code_blocks(page, "python"), 1)
]


@pytest.mark.parametrize("block", BLOCKS)
def test_the_block_parses_and_its_imports_exist(block: str) -> None:
    tree = ast.parse(block)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in USERS_OWN:
                    importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in USERS_OWN:
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    importlib.import_module(f"{node.module}.{alias.name}")


def test_there_are_blocks_to_check() -> None:
    assert len(BLOCKS) >= 20
    assert Path(ROOT / "README.md").exists()


#: Dotted names in the docs' prose that are not Python paths: a Celery queue name and
#: the console's Django permissions (``app_label.codename``).
NOT_PATHS = {
    "celery_leader.leader.worker",
    "celery_leader.view_console",
    "celery_leader.change_console",
}


def _resolve(dotted: str) -> object:
    """The object ``dotted`` names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def test_every_path_the_docs_name_in_prose_resolves() -> None:
    """``celery_leader.x.y`` in the prose of any page names a module or a name that exists.

    Code blocks are checked above; this catches the paths the text tells users
    to type or import (``celery_leader.leader_queue(...)``, ``celery_leader.election.pins``).
    """
    paths = set()
    for page in PAGES:
        for span in re.findall(r"`([^`\n]+)`", (ROOT / page).read_text()):
            paths.update(re.findall(r"\bcelery_leader(?:\.\w+)+", span))
    assert len(paths) >= 20
    django = {dotted for dotted in paths if ".django" in dotted}
    for dotted in sorted(paths - NOT_PATHS - django):
        _resolve(dotted)
    # Django's modules need configured settings: the example project's, in a process of their own.
    program = (
        "import django, sys; django.setup(); from tests.test_docs_blocks import _resolve; "
        "[_resolve(d) for d in sys.argv[1:]]"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "proj.settings"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "example_project"), str(ROOT)])
    subprocess.run([sys.executable, "-c", program, *sorted(django)], env=env, check=True)


def test_every_name_of_the_plain_python_api_page_exists() -> None:
    """The members ``docs/python-api.md`` lists in its tables are ``Leadership``'s."""
    from celery_leader import Leadership

    text = (ROOT / "docs" / "python-api.md").read_text()
    members = re.findall(r"^\| `(\w+)(?:\(|`)", text, re.MULTILINE)
    assert {"is_leader", "epoch", "wait_until_leading"} <= set(members)
    callbacks = {"on_started", "on_stopped", "on_new_leader"}
    missing = [m for m in members if m not in callbacks and not hasattr(Leadership, m)]
    assert not missing
