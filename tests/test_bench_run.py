"""``benchmarks/run.py --publish``: it writes the page's last section, "Latest results", and
keeps the longer benchmarks' sections above it as they are."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.run import DOCS, LATEST, published

REPORT = "_run on a machine._\n\n## 1. Hand-over gap\n\n![plot](failover.png)\n\n### Goals\n"


def test_publish_replaces_only_the_latest_results() -> None:
    page = "# Benchmarks\n\n## Soak\n\nby hand\n\n## Latest results\n\n_old run._\n\n### 1. Old\n"
    assert published(page, REPORT) == (
        "# Benchmarks\n\n## Soak\n\nby hand\n\n## Latest results\n\n"
        "_run on a machine._\n\n### 1. Hand-over gap\n\n![plot](img/failover.png)\n\n#### Goals\n"
    )


def test_the_page_ends_with_the_section_publish_writes() -> None:
    page = Path(DOCS / "benchmarks.md").read_text()
    assert page.count(LATEST) == 1
    latest = page.partition(LATEST)[2]
    assert not [line for line in latest.splitlines() if line.startswith("## ")]


def test_the_script_runs_as_the_readme_says() -> None:
    # 0fe5b43 dropped its ``__main__`` guard: the command printed nothing, exited 0.
    script = DOCS.parent / "benchmarks" / "run.py"
    done = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "--publish" in done.stdout
