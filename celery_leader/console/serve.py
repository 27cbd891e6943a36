"""The console in a process of its own: the standard library's ``wsgiref`` server,
one thread per request.

A page of the console is a few store reads rendered for a handful of operators:
``wsgiref`` serves that without another dependency, and a deployment that
wants more (TLS, many users) mounts :func:`~.app.console_app` in its own WSGI
server or behind a reverse proxy instead.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ..settings.config import LOOPBACK_NAMES
from .app import Console
from .security import check_start, is_loopback

logger = logging.getLogger(__name__)

#: The console's port unless told otherwise (Flower's, which it sits beside).
PORT = 5555
#: The address it binds unless told otherwise: this host only.
BIND = "127.0.0.1"


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow client never holds up the exit


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(WSGIRequestHandler):
    """Logs each request through ``logging`` (wsgiref writes to stderr)."""

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)


def url_of(bind: str, port: int) -> str:
    """The URL the console answers at."""
    host = f"[{bind}]" if ":" in bind else bind
    return f"http://{host}:{port}/"


def serve(
    console: Console,
    bind: str = BIND,
    port: int = PORT,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``console`` on ``bind``:``port`` until SIGTERM or SIGINT; then close it.

    Refuses first, in one line (a :class:`~celery_leader.exceptions.ConfigError`),
    to listen on an address other than loopback without ``leader_console_token``,
    and write mode without it. ``ready`` is told the URL once it listens.
    """
    config = console.config
    check_start(bind, config.console_write, config.console_token)
    server_class = _Server6 if ":" in bind else _Server
    httpd = make_server(bind, port, console, server_class=server_class, handler_class=_Handler)
    url = url_of(bind, httpd.server_port)
    mode = "write mode, token required" if console.write else "read-only"
    if config.console_token and not console.write:
        mode += ", token required"
    logger.info("celery-leader console at %s (%s; store %s)", url, mode, config.display_url)
    if not is_loopback(bind) and set(config.console_allowed_hosts) <= set(LOOPBACK_NAMES):
        logger.warning(
            "celery-leader console: it listens on %s but answers only to the names in "
            "leader_console_allowed_hosts (%s): add the name it is reached by",
            bind,
            ", ".join(config.console_allowed_hosts),
        )
    stop = threading.Event()

    def shut(signum: int, frame: object) -> None:
        if not stop.is_set():
            stop.set()
            # shutdown() waits for serve_forever, which runs in this very thread.
            threading.Thread(target=httpd.shutdown, daemon=True).start()

    previous = {sig: signal.signal(sig, shut) for sig in (signal.SIGTERM, signal.SIGINT)}
    if ready is not None:
        ready(url)
    try:
        httpd.serve_forever()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        httpd.server_close()
        console.close()
