"""A TCP proxy that a test can stall or cut, to put a network fault between a client and a store.

Written here rather than taken from PyPI: the packages found there either drive an
external toxiproxy binary (which cannot be installed from a package registry) or are
unmaintained asyncio proxies without a "stall but keep the bytes" mode, which is the
fault that matters most for leases: a leader whose renewals silently hang.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

_CHUNK = 65536


class _Link:
    """One client connection and, once forwarding starts, its upstream connection."""

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None
        self.closed = False

    def sockets(self) -> list[socket.socket]:
        return [s for s in (self.client, self.upstream) if s is not None]


class TcpProxy:
    """Listens on 127.0.0.1:``port`` and forwards every connection to the target.

    ``hold()`` stops moving bytes in both directions without closing anything: what is
    sent meanwhile waits in the proxy and the kernel's buffers and is delivered, in
    order, after ``release()``. Connections accepted while held are not even opened
    upstream until then, so the server cannot tell a held client from a silent one.

    ``hold_replies()`` holds one direction only: bytes from the server to the client
    wait, bytes from the client still reach the server. A request is served and its
    reply never arrives (a publish routed by the broker whose confirm is stuck), until
    ``release()`` delivers it, or ``cut()`` drops it. ``replies_waiting()`` says how
    many connections have such a reply waiting: the moment a request is in flight.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        # One condition guards all state; pumps wait on it while the proxy is held.
        self._cond = threading.Condition()
        self._held = False
        self._replies_held = False
        self._replies_waiting = 0
        self._closed = False
        self._links: set[_Link] = set()
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept_loop)

    def url_for(self, url: str) -> str:
        """``url`` with its host and port replaced by this proxy's, credentials kept."""
        parts = urlsplit(url)
        userinfo, at, _ = parts.netloc.rpartition("@")
        return urlunsplit(parts._replace(netloc=f"{userinfo}{at}127.0.0.1:{self.port}"))

    def hold(self) -> None:
        with self._cond:
            self._held = True

    def hold_replies(self) -> None:
        """Stop bytes from the server to the client only; see the class docstring."""
        with self._cond:
            self._replies_held = True

    def replies_waiting(self) -> int:
        """How many connections have bytes from the server held back, now."""
        with self._cond:
            return self._replies_waiting

    def release(self) -> None:
        """Ends :meth:`hold` and :meth:`hold_replies`: what waited is delivered, in order."""
        with self._cond:
            self._held = False
            self._replies_held = False
            self._cond.notify_all()

    def cut(self) -> None:
        """Close every current connection; new ones are still accepted."""
        with self._cond:
            links = list(self._links)
        for link in links:
            self._drop(link)

    def close(self) -> None:
        with self._cond:
            self._closed = True
        # On Linux, shutdown() is what wakes a thread blocked in accept(); close() does not.
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self.cut()
        for thread in self._threads:
            thread.join(timeout=5)

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            link = _Link(client)
            with self._cond:
                if self._closed:
                    client.close()
                    return
                self._links.add(link)
            self._spawn(self._connect_upstream, link)

    def _wait_until_flowing(self, link: _Link, reply: bool = False) -> bool:
        """Block while held (``reply``: or while replies are held); False once the link
        has been dropped."""
        with self._cond:

            def flowing() -> bool:
                return not (self._held or (reply and self._replies_held)) or link.closed

            waiting = reply and not flowing()
            self._replies_waiting += int(waiting)
            self._cond.wait_for(flowing)
            self._replies_waiting -= int(waiting)
            return not link.closed

    def _connect_upstream(self, link: _Link) -> None:
        if not self._wait_until_flowing(link):
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            self._drop(link)
            return
        upstream.settimeout(None)
        with self._cond:
            if link.closed:
                upstream.close()
                return
            link.upstream = upstream
        self._spawn(self._pump, link, upstream, link.client, True)
        self._pump(link, link.client, upstream, False)

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket, reply: bool) -> None:
        try:
            while True:
                data = src.recv(_CHUNK)
                # Checked after recv so that data (and EOF) arriving while held waits here.
                if not self._wait_until_flowing(link, reply):
                    return
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        # Either side closing ends the pair; neither Redis nor PostgreSQL half-closes.
        self._drop(link)

    def _drop(self, link: _Link) -> None:
        with self._cond:
            if link.closed:
                return
            link.closed = True
            self._links.discard(link)
            self._cond.notify_all()
        for sock in link.sockets():
            # shutdown() first: it wakes the other pump if it is blocked in recv().
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
