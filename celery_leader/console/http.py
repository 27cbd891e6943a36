"""A WSGI request and response, as small as the console needs (no framework)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode

from .security import MAX_BODY, cookies

#: What a WSGI server hands the application to start its response with.
StartResponse = Callable[..., Any]
#: A WSGI application.
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

_REASONS = {
    200: "OK",
    303: "See Other",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Content Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


#: The most fields a form may have: a bulk pause of its most entries, and a few more.
MAX_FIELDS = 1000


class BodyTooLarge(Exception):
    """The request's body is over :data:`~.security.MAX_BODY`, or has more than
    :data:`MAX_FIELDS` fields."""


@dataclass
class Request:
    """One request: method, path, query, headers, and its form (read when asked)."""

    environ: Mapping[str, Any]

    @property
    def method(self) -> str:
        return str(self.environ.get("REQUEST_METHOD", "GET")).upper()

    @property
    def path(self) -> str:
        return str(self.environ.get("PATH_INFO", "") or "/")

    @property
    def root(self) -> str:
        """Where the console is mounted (``SCRIPT_NAME``, no trailing slash): the prefix
        of every link and redirect, empty at a server's root."""
        return str(self.environ.get("SCRIPT_NAME", "")).rstrip("/")

    @property
    def scheme(self) -> str:
        return str(self.environ.get("wsgi.url_scheme", "http"))

    @property
    def host(self) -> str:
        """The ``Host`` header (empty when the request has none)."""
        return str(self.environ.get("HTTP_HOST", ""))

    def header(self, name: str) -> str | None:
        """A request header, by its HTTP name (``Origin``)."""
        value = self.environ.get("HTTP_" + name.upper().replace("-", "_"))
        return None if value is None else str(value)

    def arg(self, name: str, default: str = "") -> str:
        """A query parameter (the first of a repeated one)."""
        values = parse_qs(str(self.environ.get("QUERY_STRING", ""))).get(name)
        return values[0] if values else default

    def query(self, **changes: str | None) -> str:
        """The query string with ``changes`` (``None`` drops a parameter), for links
        that keep what the page shows."""
        params = parse_qs(str(self.environ.get("QUERY_STRING", "")))
        for name, value in changes.items():
            params.pop(name, None)
            if value is not None:
                params[name] = [value]
        return urlencode(params, doseq=True)

    def number(self, name: str, default: int) -> int:
        """A whole-number query parameter; ``default`` when absent or not a number."""
        try:
            return int(self.arg(name, str(default)))
        except ValueError:
            return default

    def cookie(self, name: str) -> str | None:
        return cookies(self.header("Cookie")).get(name)

    def form(self) -> dict[str, list[str]]:
        """The url-encoded body of a POST; :class:`BodyTooLarge` past the cap, read
        no further than its declared length."""
        try:
            length = int(self.environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > MAX_BODY:
            raise BodyTooLarge
        body = self.environ["wsgi.input"].read(length) if length > 0 else b""
        try:
            return parse_qs(body.decode("utf-8", "replace"), max_num_fields=MAX_FIELDS)
        except ValueError:  # more fields than any form of the console has
            raise BodyTooLarge from None


def first(form: Mapping[str, list[str]], name: str) -> str:
    """The first value of field ``name`` of a form (empty when absent)."""
    values = form.get(name)
    return values[0] if values else ""


@dataclass
class Response:
    """A response: status, body, and headers besides the security ones."""

    status: int
    body: bytes
    content_type: str = "text/html; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def json(cls, data: Any, status: int = 200) -> Response:
        return cls(status, json.dumps(data, indent=1).encode(), "application/json")

    @classmethod
    def text(cls, text: str, status: int) -> Response:
        return cls(status, (text + "\n").encode(), "text/plain; charset=utf-8")

    @classmethod
    def redirect(cls, location: str) -> Response:
        return cls(303, b"", "text/plain", [("Location", location)])

    @property
    def status_line(self) -> str:
        return f"{self.status} {_REASONS.get(self.status, 'Unknown')}"
