"""The console: a web page where operators see and steer the schedule.

:func:`console_app` is a WSGI application of an app's entries (mount it in any
WSGI server); :func:`serve` runs it in a process of its own, as ``celery -A proj
leader console`` and ``python -m celery_leader console MODULE`` do. It needs
the extra ``celery-leader[console]`` (Jinja2). See docs/console.md.
"""

from __future__ import annotations

from .app import Console, console_app
from .serve import serve

__all__ = ["Console", "console_app", "serve"]
