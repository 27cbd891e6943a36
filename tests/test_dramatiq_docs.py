"""Every example of docs/dramatiq.md runs as written.

The Python blocks run in order in one fresh interpreter, as a reader would paste
them, with the host ``redis`` of their URLs pointing at the test's Redis server.
The error shown for a bad setting is the one the middleware raises.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from celery_leader.dramatiq import LeaderMiddleware
from celery_leader.exceptions import ConfigError

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "dramatiq.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", DOC.read_text(), re.M | re.S)


def test_the_python_examples_run_in_order(redis_url: str, tmp_path: Path) -> None:
    code = "\n".join(blocks("python"))
    assert "LeaderMiddleware" in code and "is_leader()" in code
    code = code.replace("redis://redis:6379", redis_url.rsplit("/", 1)[0])
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_bad_setting_example_is_the_error_raised() -> None:
    shown = next(b for b in blocks("") if "ConfigError" in b).strip()
    with pytest.raises(ConfigError) as raised:
        LeaderMiddleware(url="memory://", ttl="soon")  # type: ignore[arg-type]
    assert shown == f"celery_leader.exceptions.ConfigError: {raised.value}"
