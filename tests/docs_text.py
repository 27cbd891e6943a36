"""What the docs show, read back for tests that check it against the code."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def code_blocks(path: str, language: str | None = None) -> list[str]:
    """The fenced code blocks of ``path`` (from the repository root), of ``language`` if given."""
    return fenced((ROOT / path).read_text(), language)


def fenced(text: str, language: str | None = None) -> list[str]:
    """The fenced code blocks of Markdown ``text``, of ``language`` if given."""
    return [body for lang, body in _FENCE.findall(text) if language is None or lang == language]


def quoted_messages(path: str = "docs/configuration.md") -> set[str]:
    """Lines of ``path``'s plain code blocks that quote an error or a warning."""
    return {
        line
        for block in code_blocks(path, "")
        for line in block.splitlines()
        if line.startswith(("Error: ", "celery-leader: "))
    }
