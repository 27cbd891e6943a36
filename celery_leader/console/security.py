"""The console's security rules, as small pure functions the application applies to
every request: the Host allowlist, the authenticator, the CSRF token, the Origin
check, the response headers and the start-up refusals.

The page can pause and trigger tasks, so it is read-only unless
``leader_console_write`` is on *and* ``leader_console_token`` is set, and once a
token is set every request must carry it (a browser is asked for it by basic
auth). A page reached under a name that is not allowed is refused before
anything is read (DNS rebinding: a foreign site that resolves its own name to
127.0.0.1 would otherwise read the page with the visitor's browser).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Collection
from urllib.parse import urlsplit

from ..exceptions import ConfigError

#: Headers of every response, errors included: no script or style from
#: elsewhere, never framed (clickjacking), no content sniffing, nothing cached
#: (a proxy or the browser's history must not keep a page of the schedule).
HEADERS = (
    ("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Cache-Control", "no-store"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "same-origin"),
)

#: The largest request body read: an action's form is a few hundred bytes, and
#: a bulk pause names at most a page of entries.
MAX_BODY = 64 * 1024

#: The cookie that carries the CSRF secret; its HMAC goes in each form.
CSRF_COOKIE = "leader_console_csrf"
#: The form field of the CSRF token.
CSRF_FIELD = "csrf"

#: What a basic-auth prompt calls the console.
REALM = "celery-leader console"


def host_name(host: str) -> str:
    """The name part of a ``Host`` header (no port, no IPv6 brackets), lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def host_allowed(host: str, allowed: Collection[str]) -> bool:
    """Whether a request's ``Host`` names this console (``leader_console_allowed_hosts``)."""
    return bool(host) and host_name(host) in allowed


def same_origin(origin: str | None, host: str) -> bool:
    """Whether a POST's ``Origin`` names the page's own host: a browser sends it with
    every form, so a form from another site is refused here. A request without one
    (not a browser's form) passes here and still needs its CSRF token. The scheme is
    not compared: behind a proxy that ends TLS the page is ``https`` to the browser
    and ``http`` here."""
    if origin is None:
        return True
    return urlsplit(origin.strip()).netloc.lower() == host.strip().lower()


def authorized(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token``: ``Bearer <token>``, or
    basic auth with it as the password (any user name); compared in constant time."""
    if not header:
        return False
    kind, _, value = header.strip().partition(" ")
    given = value.strip()
    if kind.lower() == "basic":
        try:
            decoded = base64.b64decode(given, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return False
        given = decoded.partition(":")[2]
    elif kind.lower() != "bearer":
        return False
    return hmac.compare_digest(given.encode(), token.encode())


def basic_user(value: str) -> str | None:
    """The user name of a basic-auth credential (what the audit trail names)."""
    try:
        return base64.b64decode(value.strip(), validate=True).decode().partition(":")[0] or None
    except (binascii.Error, UnicodeDecodeError):
        return None


def new_csrf_secret() -> str:
    """A fresh CSRF secret for the cookie of a browser that has none."""
    return secrets.token_urlsafe(32)


def csrf_token(secret: str, key: str) -> str:
    """The form token of cookie ``secret``: an HMAC under ``key`` (the console's token),
    so a cookie planted by a sibling site cannot come with a matching form field."""
    return hmac.new(key.encode(), secret.encode(), hashlib.sha256).hexdigest()


def csrf_valid(secret: str | None, given: str | None, key: str) -> bool:
    """Whether a form's token matches its cookie, in constant time."""
    if not secret or not given:
        return False
    return hmac.compare_digest(csrf_token(secret, key), given)


def cookies(header: str | None) -> dict[str, str]:
    """The cookies of a ``Cookie`` header (the last of a repeated name wins)."""
    found = {}
    for part in (header or "").split(";"):
        name, sep, value = part.strip().partition("=")
        if sep:
            found[name] = value
    return found


def csrf_cookie(secret: str, secure: bool) -> str:
    """The ``Set-Cookie`` value of a CSRF secret: never sent by another site's request
    (``SameSite=Strict``), never read by a script."""
    flags = "; Secure" if secure else ""
    return f"{CSRF_COOKIE}={secret}; Path=/; HttpOnly; SameSite=Strict{flags}"


def is_loopback(address: str) -> bool:
    """Whether ``address`` (what the console binds) only reaches this host."""
    if address.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def check_start(bind: str, write: bool, token: str | None) -> None:
    """Refuse, in one line, a console that would be open to others or write without a
    token (``leader_console_write``, ``leader_console_token``)."""
    if write and not token:
        raise ConfigError(
            "leader_console_write is on but leader_console_token is not set: "
            "the console changes nothing without an authenticator"
        )
    if not token and not is_loopback(bind):
        raise ConfigError(
            f"the console does not listen on {bind} (not loopback) without an "
            "authenticator: set leader_console_token, or bind 127.0.0.1"
        )
