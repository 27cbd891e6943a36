"""Clean virtualenvs: what a user who pip-installs the package gets, and nothing more."""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path


def clean_venv(where: Path, *requirements: str) -> tuple[str, set[str]]:
    """A new virtualenv in ``where/venv`` with only ``requirements`` pip-installed.

    Returns its python and the (lower-case) names of every distribution in it, so a
    test can say what must and must not have come along. pip runs in ``where``, not
    in the caller's directory.
    """
    env_dir = where / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", *requirements],
        capture_output=True,
        text=True,
        cwd=where,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True
    ).stdout.lower()
    return python, {line.split("==")[0] for line in listed.splitlines()}
