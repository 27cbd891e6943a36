"""``leader_health_port``: ``GET /healthz`` and ``GET /leader`` over HTTP, standard library only.

``/healthz`` judges the health record as ``leader check`` judges the file (200 or 503,
with its line); ``/leader`` answers JSON. One server per port and process: several
elections of one process (beat inside a worker) share it.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..backends import HolderInfo
from ..election.lease import Lease
from .health import HealthFile, judge


class LeaderSeen:
    """The last leader a lease told of, and since when: what ``/leader`` says.

    Give it to the join as ``Callbacks(on_new_leader=...)``. "Since" is the term's
    start as the store recorded it, or, for a term that does not say (written by
    celery-leader 0.4.0), when this process first saw it.
    """

    def __init__(self) -> None:
        # One tuple, replaced whole: the lease thread writes, request threads read.
        self.last: tuple[HolderInfo, float] | None = None

    def __call__(self, lease: Lease, holder: HolderInfo) -> None:
        self.last = (holder, lease.clock.time() if holder.since is None else holder.since)


#: A health record and the leader its election last saw.
Served = tuple[HealthFile, LeaderSeen]

_lock = threading.Lock()
_servers: dict[int, tuple[ThreadingHTTPServer, list[Served]]] = {}


def serve(port: int, health: HealthFile, seen: LeaderSeen, addr: str = "0.0.0.0") -> None:  # noqa: S104 - probes come from outside
    """Serve ``health`` and ``seen`` on ``port`` (the server starts on the first call for
    that port); :class:`OSError` when the port is taken."""
    with _lock:
        found = _servers.get(port)
        if found is None:
            records: list[Served] = []
            server = ThreadingHTTPServer((addr, port), _handler(records))
            server.daemon_threads = True
            threading.Thread(
                target=server.serve_forever, name=f"celery-leader:health:{port}", daemon=True
            ).start()
            found = _servers[port] = (server, records)
        if (health, seen) not in found[1]:
            found[1].append((health, seen))


def healthz(records: list[Served]) -> tuple[bool, str]:
    """Every record judged as ``leader check`` judges a file: healthy only if all are."""
    if not records:
        return False, "UNHEALTHY: this process takes part in no election"
    # Before the first write (a process still starting) judge a fresh snapshot.
    results = [
        judge(health.latest or health.snapshot(), f"the health record of {health.lease.election!r}")
        for health, _ in records
    ]
    return all(ok for ok, _ in results), "\n".join(line for _, line in results)


def leader(health: HealthFile, seen: LeaderSeen) -> dict[str, Any]:
    """``/leader`` for one election: who this process last saw lead, and since when."""
    lease = health.lease
    last = seen.last
    return {
        "election": lease.election,
        "holder": None if last is None else last[0].instance_id,
        "epoch": None if last is None else last[0].epoch,
        "since": None if last is None else last[1],
        "this_process_leads": lease.is_leader(),
        # This host's clock against the store's, as leader status shows it
        # (None: not measured yet, or a store without a clock of its own).
        "clock_offset": lease.store_clock.offset,
        "clock_error": lease.store_clock.error,
        "clock_problem": lease.clock_problem,
    }


def _handler(records: list[Served]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            with _lock:
                current = list(records)
            if path == "/healthz":
                ok, text = healthz(current)
                self._send(200 if ok else 503, "text/plain; charset=utf-8", text + "\n")
            elif path == "/leader":
                rows = [leader(health, seen) for health, seen in current]
                body: Any = rows[0] if len(rows) == 1 else rows
                self._send(200, "application/json", json.dumps(body) + "\n")
            else:
                self._send(404, "text/plain; charset=utf-8", "not found: try /healthz or /leader\n")

        def _send(self, code: int, content_type: str, text: str) -> None:
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # probes every few seconds would fill the log

    return Handler
