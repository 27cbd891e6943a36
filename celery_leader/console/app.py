"""The console as a WSGI application: routing, the security rules of every request,
and the views' pages and JSON twins.

Every request passes, in order: the Host allowlist; the authenticator (once
``leader_console_token`` is set, every request carries it); for a POST, write
mode, the body cap, the Origin check and the CSRF token. Every response, errors
included, carries :data:`~.security.HEADERS`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from ..backends import StoreFacets, open_store
from ..backends.urls import mask_url
from ..cli.entries import EntriesApp
from ..exceptions import ConfigError, StoreUnavailable
from ..schedule.plan import PlanError
from . import pages, plan, security, timeline
from .actions import MAX_BULK, ActionError, Actions, Actor, reason
from .http import BodyTooLarge, Request, Response, StartResponse, first
from .listing import PAGE, EntryCache
from .reads import Reads
from .render import Renderer, static

logger = logging.getLogger(__name__)

#: The views of the navigation bar: path, title.
NAV = (
    ("/", "Cluster"),
    ("/entries", "Entries"),
    ("/problems", "Problems"),
    ("/timeline", "Timeline"),
    ("/plan", "Plan"),
)
#: The slowest auto-refresh a page may ask for, and the fastest, in seconds.
REFRESH = (2, 3600)


class Console:
    """The console of one app's entries, as a WSGI application.

    Read-only unless ``leader_console_write`` is on and ``leader_console_token`` is
    set. It opens one store connection, used by every request; :meth:`close` it.
    """

    def __init__(self, app: EntriesApp) -> None:
        self.app = app
        self.config = app.config
        self.token = app.config.console_token
        #: Whether pages show forms and POSTs change anything.
        self.write = bool(app.config.console_write and self.token)
        self.store: StoreFacets = open_store(app.config)
        self.actions = Actions(app)
        self.entries = EntryCache(app)
        self.renderer = Renderer()

    def close(self) -> None:
        """Close the store connection."""
        self.store.close()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        request = Request(environ)
        try:
            response = self.respond(request)
        except StoreUnavailable as exc:
            shown = mask_url(f"store {self.config.display_url} unreachable: {exc}")
            response = self._error(request, 503, shown)
        except Exception:
            logger.exception("celery-leader console: %s %s failed", request.method, request.path)
            response = self._error(request, 500, "the console failed: see its log")
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            *response.headers,
            *security.HEADERS,
        ]
        start_response(response.status_line, headers)
        return [b"" if request.method == "HEAD" else response.body]

    # -- the rules -----------------------------------------------------------------

    #: The form field of the CSRF token in the pages' forms.
    csrf_field = security.CSRF_FIELD

    def respond(self, request: Request) -> Response:
        """The response to ``request``, after the security rules."""
        refused = self.guard(request)
        if refused is not None:
            return refused
        if request.method in ("GET", "HEAD"):
            return self._get(request)
        if request.method != "POST":
            return Response(405, b"", "text/plain", [("Allow", "GET, HEAD, POST")])
        return self._post(request)

    # The four methods below are the authenticator: a host that authenticates on its
    # own (the Django view) replaces them, and the pages and actions stay the same.

    def guard(self, request: Request) -> Response | None:
        """The refusal of a request before anything is read (Host, token), or ``None``."""
        if not security.host_allowed(request.host, self.config.console_allowed_hosts):
            return Response.text("unknown Host: add it to leader_console_allowed_hosts", 400)
        if self.token is not None and not security.authorized(
            request.header("Authorization"), self.token
        ):
            challenge = f'Basic realm="{security.REALM}", charset="UTF-8"'
            return Response(
                401,
                b"the console needs its token\n",
                "text/plain",
                [("WWW-Authenticate", challenge)],
            )
        return None

    def writes(self, request: Request) -> bool:
        """Whether ``request`` may change entries (and its pages show forms)."""
        return self.write

    def post_guard(self, request: Request, form: dict[str, list[str]]) -> Response | None:
        """The refusal of a POST from another site or without its CSRF token, or ``None``."""
        if not security.same_origin(request.header("Origin"), request.host):
            return self._error(request, 403, "refused: the form came from another site")
        assert self.token is not None  # write mode has one
        secret = request.cookie(security.CSRF_COOKIE)
        given = first(form, security.CSRF_FIELD)
        if not security.csrf_valid(secret, given, self.token):
            return self._error(request, 403, "refused: no valid CSRF token (reload the page)")
        return None

    def csrf(self, request: Request, headers: list[tuple[str, str]]) -> str:
        """The CSRF token of a write-mode page's forms; a cookie it needs goes in
        ``headers``."""
        assert self.token is not None
        secret = request.cookie(security.CSRF_COOKIE)
        if not secret:
            secret = security.new_csrf_secret()
            secure = request.scheme == "https"
            headers.append(("Set-Cookie", security.csrf_cookie(secret, secure)))
        return security.csrf_token(secret, self.token)

    def _get(self, request: Request) -> Response:
        parts = [p for p in request.path.split("/") if p]
        if parts[:1] == ["static"] and len(parts) == 2:
            file = static(parts[1])
            if file is None:
                return self._error(request, 404, "no such file")
            return Response(200, file[0], file[1])
        if parts == ["metrics"]:
            data = pages.problems(Reads(self.app, self.store, self.entries))
            return Response(200, pages.metrics(data).encode(), "text/plain; version=0.0.4")
        as_json = parts[:1] == ["api"]
        if as_json:
            parts = parts[1:] or ["cluster"]
        try:
            found = self._view(request, parts)
        except (PlanError, ConfigError) as exc:
            return self._error(request, 400, str(exc).splitlines()[0], as_json)
        if found is None:
            return self._error(request, 404, "no such page or entry", as_json)
        template, data = found
        if as_json:
            return Response.json(data)
        return self._page(request, template, data)

    def _view(self, request: Request, parts: list[str]) -> tuple[str, dict[str, Any]] | None:
        reads = Reads(self.app, self.store, self.entries)
        if parts in ([], ["cluster"]):
            return "cluster.html", pages.cluster(reads)
        if parts == ["entries"]:
            data = pages.entries(
                reads,
                request.arg("q"),
                request.arg("filter"),
                request.number("page", 1),
                request.number("per_page", PAGE),
            )
            return "entries.html", data
        if len(parts) >= 2 and parts[0] == "entries":
            # A code entry's name may hold a "/" (beat_schedule's keys are free text).
            name = "/".join(parts[1:])
            shown = request.arg("show") == "args"
            one = pages.entry(reads, name, request.number("runs", pages.RUNS), shown)
            return None if one is None else ("entry.html", one)
        if parts == ["timeline"]:
            election = request.arg("election") or None
            return "timeline.html", timeline.timeline(
                reads, election, request.number("terms", timeline.TERMS)
            )
        if parts == ["problems"]:
            return "problems.html", pages.problems(reads)
        if parts == ["plan"]:
            data = plan.plan(reads, request.arg("from"), request.arg("to"), request.arg("tz"))
            return "plan.html", data
        return None

    def _post(self, request: Request) -> Response:
        if not self.writes(request):
            return self._error(request, 403, "the console is read-only")
        try:
            form = request.form()
        except BodyTooLarge:
            return self._error(request, 413, "the request body is too large")
        refused = self.post_guard(request, form)
        if refused is not None:
            return refused
        parts = [p for p in request.path.split("/") if p]
        who = self.who(request)
        try:
            if parts == ["entries", "pause"]:
                return self._bulk_pause(request, form, who)
            if len(parts) >= 3 and parts[0] == "entries":
                return self._act(request, "/".join(parts[1:-1]), parts[-1], form, who)
        except (ActionError, ConfigError) as exc:
            return self._error(request, 400, str(exc).splitlines()[0])
        return self._error(request, 404, "no such action")

    def _act(
        self, request: Request, name: str, action: str, form: dict[str, list[str]], who: str
    ) -> Response:
        if action == "pause":
            why = reason(first(form, "reason"))
            self.actions.pause([name], Actor(who, why), first(form, "until").strip())
        elif action == "resume":
            self.actions.resume(name, Actor(who))
        elif action == "run":
            result = self.actions.run_now(name, Actor(who), first(form, "key") or None)
            ran = quote(result.state)
            return Response.redirect(f"{request.root}/entries/{quote(name)}?run={ran}")
        else:
            raise ActionError(f"no action {action!r}")
        return Response.redirect(f"{request.root}/entries/{quote(name)}")

    def _bulk_pause(self, request: Request, form: dict[str, list[str]], who: str) -> Response:
        names = sorted(set(form.get("name") or []))[: MAX_BULK + 1]
        why = reason(first(form, "reason"))
        if first(form, "confirm") != "yes":
            until = first(form, "until").strip()
            data = {"names": names, "reason": why, "until": until, "max": MAX_BULK}
            return self._page(request, "confirm.html", data)
        self.actions.pause(names, Actor(who, why), first(form, "until").strip())
        return Response.redirect(f"{request.root}/entries?filter=paused")

    def who(self, request: Request) -> str:
        """Who asks, for the audit trail: the basic-auth user name, else "token", and
        where from."""
        user = "token"
        kind, _, value = (request.header("Authorization") or "").partition(" ")
        if kind.lower() == "basic":
            user = security.basic_user(value) or user
        return f"console:{user}@{request.environ.get('REMOTE_ADDR', '?')}"

    # -- pages ---------------------------------------------------------------------

    def _page(
        self, request: Request, template: str, data: dict[str, Any], status: int = 200
    ) -> Response:
        headers: list[tuple[str, str]] = []
        write = self.writes(request)
        csrf = self.csrf(request, headers) if write else None
        refresh = request.number("refresh", 0)
        body = self.renderer.page(
            template,
            data=data,
            path=request.path,
            nav=NAV,
            write=write,
            csrf=csrf,
            csrf_field=self.csrf_field,
            root=request.root,
            refresh=min(max(refresh, REFRESH[0]), REFRESH[1]) if refresh else 0,
            query=request.query(refresh=None),
            # The answer to a run now, on the page it came back to; a fresh idempotency
            # key for the next one, so a form sent twice runs once.
            ran=request.arg("run"),
            run_key=secrets.token_urlsafe(16) if write else None,
            refreshing=request.query(refresh="10"),
            store=self.config.display_url,
        )
        return Response(status, body, headers=headers)

    def _error(
        self, request: Request, status: int, message: str, as_json: bool | None = None
    ) -> Response:
        if as_json is None:
            as_json = request.path.startswith("/api/")
        if as_json:
            return Response.json({"error": message}, status)
        try:
            return self._page(request, "error.html", {"status": status, "message": message}, status)
        except Exception:  # the error page itself failed: plain text says it all
            return Response.text(message, status)


def console_app(app: EntriesApp) -> Console:
    """The console of ``app``'s entries, as a WSGI application.

    ``app`` is what the ``leader entries`` commands use:
    :func:`celery_leader.celery.entries.entries_app` of a Celery app, or
    :func:`celery_leader.dramatiq.entries.load` of a Dramatiq broker module. Mount
    it in any WSGI server; it reads the store only, and changes entries only in
    write mode (``leader_console_write`` and ``leader_console_token``).
    """
    return Console(app)
