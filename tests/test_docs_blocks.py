"""Every Python block of the README and docs is valid Python, and what it imports exists.

Blocks that need servers are run elsewhere (the README tour in
tests/test_readme_tour.py, the example projects in tests/test_testing_helpers.py);
here each block is parsed, and each of its imports runs, so a renamed or removed
name in any block a user would paste fails the suite.
"""

from __future__ import annotations

import ast
import importlib
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
