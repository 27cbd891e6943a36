"""The console's pages inside Django: one view hands each request to the console's own
request handling, with Django as its authenticator.

Django decides who may come in (a logged-in staff user with
``celery_leader.view_console``, else the login page or 403), who may act
(``celery_leader.change_console``, and ``leader_console_write`` still on), and checks
each POST's CSRF token and Origin (:func:`~django.views.decorators.csrf.csrf_protect`,
whether or not the project has the middleware). The console's Host allowlist and
token step aside for Django's ``ALLOWED_HOSTS`` and login; its security headers stay.
The Celery app is the project's (``celery.current_app``: the app its ``proj/__init__.py``
imports, configured from the ``CELERY_*`` settings).
"""

from __future__ import annotations

import io
import threading
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.views import redirect_to_login  # type: ignore[import-untyped, unused-ignore]
from django.core.exceptions import PermissionDenied  # type: ignore[import-untyped, unused-ignore]
from django.http import HttpRequest, HttpResponse  # type: ignore[import-untyped, unused-ignore]
from django.middleware.csrf import get_token  # type: ignore[import-untyped, unused-ignore]
from django.views.decorators.csrf import csrf_protect  # type: ignore[import-untyped, unused-ignore]

from ...celery.entries import current_entries_app
from ...console.app import Console
from ...console.http import Request, Response

#: Who may see the console, and who may act from it (with ``leader_console_write``).
VIEW_PERMISSION = "celery_leader.view_console"
CHANGE_PERMISSION = "celery_leader.change_console"

# What the view tells the console about the request, in its WSGI environ.
_USER = "celery_leader.user"
_WRITE = "celery_leader.write"
_CSRF = "celery_leader.csrf"


class DjangoConsole(Console):
    """The console with Django as its authenticator: the view has let the request in,
    and says in the environ who sent it, whether they may act, and their CSRF token."""

    csrf_field = "csrfmiddlewaretoken"

    def guard(self, request: Request) -> Response | None:
        return None  # Django's ALLOWED_HOSTS and login have let it in

    def writes(self, request: Request) -> bool:
        return bool(self.config.console_write) and bool(request.environ.get(_WRITE))

    def post_guard(self, request: Request, form: dict[str, list[str]]) -> Response | None:
        return None  # csrf_protect has checked the token and the Origin

    def csrf(self, request: Request, headers: list[tuple[str, str]]) -> str:
        return str(request.environ[_CSRF])

    def who(self, request: Request) -> str:
        user = request.environ.get(_USER) or "?"
        return f"django:{user}@{request.environ.get('REMOTE_ADDR', '?')}"


_console: DjangoConsole | None = None
_lock = threading.Lock()


def django_console() -> DjangoConsole:
    """The process's console (one store connection for every request), made on first use
    from the project's Celery app."""
    global _console
    with _lock:
        if _console is None:
            _console = DjangoConsole(current_entries_app())
        return _console


@csrf_protect  # type: ignore[misc, untyped-decorator, unused-ignore]
def console(request: HttpRequest, path: str = "") -> HttpResponse:
    """A page, JSON twin or action of the console; ``path`` is its path below the prefix."""
    user = request.user
    if not user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    if not (user.is_staff and user.has_perm(VIEW_PERMISSION)):
        raise PermissionDenied
    environ: dict[str, Any] = dict(request.META)
    environ["SCRIPT_NAME"] = request.path[: len(request.path) - len(path)]
    environ["PATH_INFO"] = "/" + path
    # The CSRF check has parsed the form (url-encoded or multipart) already; the console
    # reads it again, url-encoded, under its own body cap.
    body = (
        urlencode(list(request.POST.lists()), doseq=True).encode()
        if request.method == "POST"
        else b""
    )
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    environ["CONTENT_TYPE"] = "application/x-www-form-urlencoded"
    environ[_USER] = user.get_username()
    environ[_WRITE] = user.has_perm(CHANGE_PERMISSION)
    environ[_CSRF] = get_token(request)
    started: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        started[:] = [status, headers]

    content = b"".join(django_console()(environ, start_response))
    status, headers = started
    response = HttpResponse(content, status=int(status.split()[0]))
    for name, value in headers:
        response[name] = value
    return response
