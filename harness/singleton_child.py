"""The command the singleton tests run: appends ``pid epoch start now`` to a file every 50 ms.

Times are ``time.monotonic()`` (one clock for every process on a Linux host), so
a reader can lay the lifetimes of all children side by side. ``epoch`` is the
``LEADER_EPOCH`` it was started with (``-`` when none, as under single-beat).
"""

from __future__ import annotations

import os
import sys
import time


def main(path: str) -> None:
    start = time.monotonic()
    epoch = os.environ.get("LEADER_EPOCH", "-")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    while True:
        # One write of one short line with O_APPEND: lines of several children never interleave.
        os.write(fd, f"{os.getpid()} {epoch} {start!r} {time.monotonic()!r}\n".encode())
        time.sleep(0.05)


if __name__ == "__main__":
    main(sys.argv[1])
