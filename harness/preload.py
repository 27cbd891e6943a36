"""Build an ``LD_PRELOAD`` shim from C source, once per test run.

Used by :mod:`harness.clock_shift` and :mod:`harness.fakeclock`; compiled with the
system's C compiler into a fresh temporary directory.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

_built: dict[str, Path] = {}


def build(name: str, source: str) -> Path:
    """The shared library ``lib<name>.so`` compiled from ``source`` (cached per process)."""
    if name not in _built:
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            raise RuntimeError(f"a C compiler (cc) is needed to build the {name} shim")
        directory = Path(tempfile.mkdtemp(prefix=f"celery-leader-{name}-"))
        (directory / f"{name}.c").write_text(source)
        subprocess.run(
            [cc, "-shared", "-fPIC", "-O2", "-o", f"lib{name}.so", f"{name}.c"],
            cwd=directory,
            check=True,
            capture_output=True,
        )
        _built[name] = directory / f"lib{name}.so"
    return _built[name]
