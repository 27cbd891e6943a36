"""What every store says when a call fails (one wording for all), and how it hands back writes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..exceptions import StoreUnavailable
from .records import Write


def first_line(exc: BaseException) -> str:
    """The first line of a store client's error, at most 300 characters."""
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else ""


def summarise(exc: BaseException) -> str:
    """One line for a store client's error: its type and :func:`first_line`."""
    return f"{type(exc).__name__}: {first_line(exc)}"


def hand_back(
    writes: Sequence[Write], won: Sequence[bool], undo: Callable[[list[Write]], None]
) -> str:
    """Undo the ``writes`` that ``won`` but were not confirmed; how that went."""
    back = [w for w, ok in zip(writes, won, strict=True) if ok]
    if not back:
        return "nothing claimed"
    try:
        undo(back)
    except StoreUnavailable as exc:
        # Left claimed on the primary: the slots are skipped, never sent twice.
        return f"handing them back failed too ({exc})"
    return "handed back, nothing may be sent on them"
