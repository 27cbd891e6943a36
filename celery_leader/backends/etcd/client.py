"""Calls to an etcd cluster through its gRPC gateway: one deadline, member fail-over, auth.

What etcd3gw lacks: one deadline per operation (:class:`_DeadlineSession` caps each
request at what is left of it), skipping a member that refuses or has no Raft leader,
and auth tokens fetched again when expired. Watches are made here too: etcd3gw's
watcher has no timeout and hangs for good behind a partition.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import requests
from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import ConnectionFailedError, ConnectionTimeoutError, Etcd3Exception

from ...exceptions import StoreMisconfigured, StoreUnavailable
from ..errors import summarise
from .params import EtcdParams
from .wire import Op, b64

T = TypeVar("T")

#: gRPC status codes that etcd's gateway reports in its JSON errors.
INVALID_ARGUMENT = 3
NOT_FOUND = 5
PERMISSION_DENIED = 7
FAILED_PRECONDITION = 9
UNAVAILABLE = 14
UNAUTHENTICATED = 16

#: The gateway's path on etcd >= 3.4 (3.3 and older are end-of-life).
API_PATH = "/v3/"

_local = threading.local()


class _DeadlineSession(requests.Session):
    """A session whose requests give up at the calling thread's deadline, if one is set."""

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> Any:
        # Per request: requests lets REQUESTS_CA_BUNDLE override a session's CA file.
        kwargs.setdefault("verify", self.verify)
        deadline: float | None = getattr(_local, "deadline", None)
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise requests.exceptions.Timeout("the store deadline passed")
            # requests applies it to the connect and to every read.
            kwargs["timeout"] = min(left, kwargs.get("timeout") or left)
        response = super().request(method, url, *args, **kwargs)
        _local.date = response.headers.get("Date")
        return response


def server_time() -> float | None:
    """The HTTP ``Date`` of the last answer this thread received from etcd's gateway,
    in seconds since the epoch (whole seconds: the header's resolution); ``None``
    when there was none or it is unreadable."""
    date: str | None = getattr(_local, "date", None)
    if not date:
        return None
    try:
        return parsedate_to_datetime(date).timestamp()
    except (TypeError, ValueError):
        return None


class _Member:
    """One member's client, and its auth token."""

    def __init__(self, host: str, port: int, params: EtcdParams, timeout: float) -> None:
        session = _DeadlineSession()
        if params.cacert is not None:
            session.verify = params.cacert
        if params.cert is not None and params.key is not None:
            session.cert = (params.cert, params.key)
        self.client = Etcd3Client(
            host,
            port,
            protocol="https" if params.tls else "http",
            timeout=timeout,
            api_path=API_PATH,
            session=session,
        )
        self.name = f"{host}:{port}"
        self._user = params.user
        self._password = params.password
        self._authenticated = params.user is None

    def authenticate(self) -> None:
        """Fetch a token for the URL's user, unless this member's session has one."""
        if self._authenticated:
            return
        self.client.session.headers.pop("Authorization", None)
        try:
            reply = self.client.post(
                self.client.get_url("/auth/authenticate"),
                json={"name": self._user, "password": self._password},
            )
        except Etcd3Exception as exc:
            code, message = error_of(exc)
            if code == FAILED_PRECONDITION and "not enabled" in message:
                # A cluster without auth serves everyone: nothing to log in to.
                self._authenticated = True
                return
            if code is not None and code != UNAUTHENTICATED:
                raise StoreMisconfigured(
                    f"leader_url: etcd refused user {self._user!r} at {self.name}: {message}"
                ) from None
            raise
        self.client.session.headers["Authorization"] = reply["token"]
        self._authenticated = True

    def forget_token(self) -> None:
        """Log in again before the next request (etcd said the token expired)."""
        self._authenticated = self._user is None


class Cluster:
    """An etcd cluster's members, one deadline per operation, and where our keys live."""

    def __init__(self, params: EtcdParams, timeout: float, key_prefix: str) -> None:
        self.timeout = timeout
        self.key_prefix = key_prefix
        self._members = [_Member(host, port, params, timeout) for host, port in params.endpoints]
        self._preferred = 0

    def key(self, election: str, name: str) -> bytes:
        """The key ``name`` of ``election`` (see the package docstring for the names)."""
        return f"{self.key_prefix}/{election}/{name}".encode()

    @contextmanager
    def deadline(self) -> Iterator[None]:
        """Every call inside shares one deadline, ``timeout`` from the outermost entry."""
        if getattr(_local, "deadline", None) is not None:
            yield
            return
        _local.deadline = time.monotonic() + self.timeout
        try:
            yield
        finally:
            _local.deadline = None

    def call(self, fn: Callable[[Etcd3Client], T]) -> T:
        """``fn(client)`` on a member; every failure becomes one-line StoreUnavailable."""
        with self.deadline():
            failures: list[str] = []
            start = self._preferred
            for i in range(len(self._members)):
                index = (start + i) % len(self._members)
                member = self._members[index]
                try:
                    result = self._on(member, fn)
                except ConnectionFailedError as exc:
                    # Refused, reset, or no Raft leader there: the next member may do.
                    failures.append(f"{member.name}: {_brief(exc)}")
                    self._preferred = (index + 1) % len(self._members)
                    continue
                except ConnectionTimeoutError as exc:
                    self._preferred = (index + 1) % len(self._members)
                    raise StoreUnavailable(f"etcd {member.name} timed out: {_brief(exc)}") from None
                self._preferred = index
                return result
            raise StoreUnavailable(f"no etcd member answered ({'; '.join(failures)})")

    def _on(self, member: _Member, fn: Callable[[Etcd3Client], T]) -> T:
        for attempt in (1, 2):
            try:
                member.authenticate()
                return fn(member.client)
            except (ConnectionFailedError, ConnectionTimeoutError, StoreUnavailable):
                raise
            except Etcd3Exception as exc:
                code, message = error_of(exc)
                if code == UNAUTHENTICATED and attempt == 1:
                    member.forget_token()  # expired: log in again, once
                    continue
                if code == INVALID_ARGUMENT and "user name is empty" in message:
                    raise StoreMisconfigured(
                        f"leader_url: the etcd cluster at {member.name} has authentication on: "
                        "put user:password@ before the hosts"
                    ) from None
                if code == PERMISSION_DENIED:
                    raise StoreMisconfigured(
                        f"leader_url: etcd denies this user the keys it needs ({message}); "
                        "grant it readwrite on the key prefix"
                    ) from None
                raise StoreUnavailable(f"etcd {member.name}: {message}") from None
            except (requests.RequestException, ValueError, KeyError) as exc:
                raise StoreUnavailable(f"etcd {member.name}: {_brief(exc)}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def txn(self, compare: list[Op], success: list[Op], failure: Sequence[Op] = ()) -> Any:
        """One transaction: ``success`` when every ``compare`` holds, else ``failure``."""
        body = {"compare": compare, "success": success, "failure": list(failure)}
        return self.call(lambda c: c.transaction(body))

    def kv_range(self, start: bytes, end: bytes, **options: Any) -> Any:
        """The keys of ``[start, end)``; ``options`` as the gateway names them (``limit``...)."""
        body = {"key": b64(start), "range_end": b64(end), **options}
        return self.call(lambda c: c.post(c.get_url("/kv/range"), json=body))

    def grant(self, ttl: float) -> int:
        """A new etcd lease of ``ttl`` seconds, rounded up to whole ones: never shorter."""
        return int(self.call(lambda c: c.lease(max(1, math.ceil(ttl)))).id)

    def close(self) -> None:
        """Close every member's connections."""
        for member in self._members:
            member.client.session.close()

    def watch_delete(self, key: bytes, after: int | None) -> Watch:
        """Start watching for the deletion of ``key`` at a revision after ``after``."""
        return Watch(self._members[self._preferred], key, after, self.timeout)


class Watch:
    """A watch for one key's deletion, read by a daemon thread; :attr:`done` is set on one.

    It starts right after revision ``after`` (so no deletion is missed); one that
    fails just never sets :attr:`done`."""

    def __init__(self, member: _Member, key: bytes, after: int | None, timeout: float) -> None:
        #: Set when the key was deleted (or etcd compacted past ``after``).
        self.done = threading.Event()
        request: dict[str, Any] = {"key": b64(key), "filters": ["NOPUT"]}
        if after is not None:
            request["start_revision"] = str(after + 1)
        self._member = member
        self._request = {"create_request": request}
        self._timeout = timeout
        self._lock = threading.Lock()
        self._closed = False
        self._socket: Any = None
        threading.Thread(target=self._run, name="celery-leader:etcd-watch", daemon=True).start()

    def close(self) -> None:
        """Stop reading; the thread ends at once."""
        with self._lock:
            self._closed = True
            sock = self._socket
        if sock is not None:
            try:
                # shutdown(), not close(), wakes a thread blocked reading the socket.
                sock.shutdown(2)
            except OSError:
                pass

    def _run(self) -> None:
        client = self._member.client
        try:
            # The timeout bounds the connect and the wait for the response headers.
            response = client.session.post(
                client.get_url("/watch"), json=self._request, stream=True, timeout=self._timeout
            )
        except requests.RequestException:
            return
        with response:
            with self._lock:
                if self._closed or response.status_code != 200:
                    return
                connection = response.raw.connection
                if connection is None:
                    return
                self._socket = connection.sock
                # Events come whenever they come: no read timeout from here on.
                self._socket.settimeout(None)
            try:
                for line in response.iter_lines():
                    if self._finished(line):
                        return
            except (requests.RequestException, OSError, ValueError):
                return

    def _finished(self, line: bytes) -> bool:
        if not line:
            return False
        result = json.loads(line).get("result", {})
        if result.get("events") or result.get("canceled"):
            self.done.set()
            return True
        return "error" in result


def error_of(exc: Etcd3Exception) -> tuple[int | None, str]:
    """The gRPC code and message of an error the gateway sent as JSON."""
    text = exc.detail_text or ""
    try:
        body = json.loads(text)
    except ValueError:
        return None, " ".join(text.split())[:300] or type(exc).__name__
    if not isinstance(body, dict):
        return None, text[:300]
    code = body.get("code", body.get("grpc_code"))
    return (code if isinstance(code, int) else None), str(body.get("message") or text)[:300]


def _brief(exc: BaseException) -> str:
    if isinstance(exc, Etcd3Exception) and exc.detail_text:
        return error_of(exc)[1]
    return summarise(exc)
