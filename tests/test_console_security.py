"""The console's security rules, on its WSGI application in this process (memory store):
the Host allowlist, the token, read-only mode, CSRF and Origin, the body cap, the
headers of every response, and the start-up refusals."""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest

from celery_leader.cli.entries import CodeEntry, EntriesApp, ScheduleEntries
from celery_leader.console import Console, console_app
from celery_leader.console.security import (
    CSRF_COOKIE,
    HEADERS,
    MAX_BODY,
    authorized,
    check_start,
    host_name,
)
from celery_leader.exceptions import ConfigError
from celery_leader.schedule.series import Every
from celery_leader.settings.config import LeaderConfig

TOKEN = "s3cret-token"
HOST = "127.0.0.1:5555"


def _app(**settings: Any) -> EntriesApp:
    # A key prefix of its own: the memory store is one per process.
    prefix = f"console-{uuid.uuid4().hex}"
    config = LeaderConfig.from_mapping(
        {"leader_url": "memory://", "leader_key_prefix": prefix, **settings}
    )
    every = Every(timedelta(seconds=10))
    code = {
        "tick": CodeEntry("proj.tick", "every 10s", every),
        # beat_schedule's keys are free text.
        "add <b>every</b> 10 s/x": CodeEntry("proj.tick", "every 10s", every),
    }
    return EntriesApp(config, code, {"proj.tick", "proj.report"})


def _console(**settings: Any) -> Iterator[Console]:
    app = _app(**settings)
    with ScheduleEntries(app) as entries:
        entries.add("report", "proj.report", every=3600, kwargs={"customer": "<b>acme</b>"})
    console = console_app(app)
    yield console
    console.close()


@pytest.fixture
def writer() -> Iterator[Console]:
    """A console in write mode, with its token."""
    yield from _console(leader_console_write=True, leader_console_token=TOKEN)


@pytest.fixture
def reader() -> Iterator[Console]:
    """A console in its default mode: read-only, no token."""
    yield from _console()


class Reply:
    def __init__(self, status: str, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status = int(status.split()[0])
        self.headers = headers
        self.header = dict(headers)
        self.text = body.decode()


def call(
    console: Console,
    method: str,
    path: str,
    form: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    token: str | None = TOKEN,
    body: bytes | None = None,
) -> Reply:
    """One request, as a WSGI server would hand it over."""
    data = body if body is not None else urlencode(form or {}, doseq=True).encode()
    path, _, query = path.partition("?")
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "HTTP_HOST": HOST,
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(data),
        "CONTENT_LENGTH": str(len(data)),
        "REMOTE_ADDR": "127.0.0.1",
    }
    if token is not None:
        environ["HTTP_AUTHORIZATION"] = "Bearer " + token
    for name, value in (headers or {}).items():
        environ["HTTP_" + name.upper().replace("-", "_")] = value
    seen: dict[str, Any] = {}

    def start_response(status: str, response_headers: list[tuple[str, str]]) -> None:
        seen["status"], seen["headers"] = status, response_headers

    body_out = b"".join(console(environ, start_response))
    return Reply(seen["status"], seen["headers"], body_out)


def _csrf(console: Console, path: str = "/entries/report") -> tuple[str, str]:
    """The CSRF cookie a page sets and the token its forms carry."""
    page = call(console, "GET", path)
    cookie = page.header["Set-Cookie"].split(";")[0].split("=", 1)[1]
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert match, "the page's forms carry a CSRF token"
    return cookie, match[1]


def _post(
    console: Console, path: str, form: dict[str, Any], origin: str | None = "http://" + HOST
) -> Reply:
    cookie, token = _csrf(console)
    headers = {"Cookie": f"{CSRF_COOKIE}={cookie}"}
    if origin is not None:
        headers["Origin"] = origin
    return call(console, "POST", path, {**form, "csrf": token}, headers)


def _paused(console: Console) -> bool:
    entry = call(console, "GET", "/api/entries/report").text
    return '"enabled": false' in entry


# -- every response -------------------------------------------------------------------

PATHS = [
    "/", "/entries", "/entries/report", "/entries/tick", "/timeline", "/problems", "/plan",
    "/api/cluster", "/api/entries", "/api/entries/report", "/api/timeline", "/api/problems",
    "/api/plan", "/metrics", "/static/console.css", "/no/such/page", "/api/entries/nope",
]  # fmt: skip


@pytest.mark.parametrize("path", PATHS)
def test_every_response_carries_the_security_headers(
    writer: Console, path: str
) -> None:
    console = writer
    for reply in (
        call(console, "GET", path),
        call(console, "GET", path, token=None),  # refused: 401
        call(console, "GET", path, headers={"Host": "evil.example"}),  # refused: 400
        call(console, "POST", path, {"reason": "x"}),  # refused: no CSRF token
    ):
        for name, value in HEADERS:
            assert reply.header.get(name) == value, (path, reply.status, name)
    assert call(console, "GET", path).status in (200, 404)


def test_the_views_answer_with_pages_and_their_json_twins(reader: Console) -> None:
    console = reader
    for path in PATHS[:7]:
        page = call(console, "GET", path, token=None)
        assert page.status == 200, (path, page.text)
        assert page.header["Content-Type"].startswith("text/html")
    for path in PATHS[7:13]:
        twin = call(console, "GET", path, token=None)
        assert twin.status == 200 and twin.header["Content-Type"] == "application/json", path
    assert call(console, "GET", "/api/entries/nope", token=None).status == 404


# -- Host allowlist -------------------------------------------------------------------


@pytest.mark.parametrize("host", ["evil.example", "evil.example:5555", "127.0.0.2:5555", ""])
def test_a_request_for_another_host_is_refused(reader: Console, host: str) -> None:
    """DNS rebinding: a foreign name that resolves to 127.0.0.1 reads nothing."""
    console = reader
    reply = call(console, "GET", "/api/entries", headers={"Host": host}, token=None)
    assert reply.status == 400
    assert "report" not in reply.text


@pytest.mark.parametrize("host", ["localhost:5555", "127.0.0.1", "[::1]:5555", "LOCALHOST"])
def test_the_loopback_names_are_allowed_by_default(reader: Console, host: str) -> None:
    console = reader
    assert call(console, "GET", "/", headers={"Host": host}, token=None).status == 200


def test_the_allowed_hosts_setting_names_the_hosts() -> None:
    for console in _console(leader_console_allowed_hosts="console.example.com"):
        headers = {"Host": "console.example.com:443"}
        assert call(console, "GET", "/", headers=headers, token=None).status == 200
        assert call(console, "GET", "/", token=None).status == 400  # 127.0.0.1 is not listed
    assert host_name("[::1]:80") == "::1" and host_name("Example.COM:8") == "example.com"


# -- the token ------------------------------------------------------------------------


def test_with_a_token_every_request_needs_it(writer: Console) -> None:
    console = writer
    refused = call(console, "GET", "/api/entries", token=None)
    assert refused.status == 401 and "report" not in refused.text
    assert refused.header["WWW-Authenticate"].startswith("Basic realm=")
    assert call(console, "GET", "/api/entries", token="wrong").status == 401
    assert call(console, "GET", "/api/entries").status == 200
    basic = "Basic " + base64.b64encode(f"ops:{TOKEN}".encode()).decode()
    reply = call(console, "GET", "/api/entries", headers={"Authorization": basic}, token=None)
    assert reply.status == 200


def test_the_token_compare() -> None:
    basic = base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
    assert authorized(f"Bearer {TOKEN}", TOKEN)
    assert authorized(f"bearer   {TOKEN} ", TOKEN)
    assert authorized(f"Basic {basic}", TOKEN)
    for header in (
        None, "", TOKEN, f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer ",
        "Basic " + base64.b64encode(TOKEN.encode()).decode(),  # no "user:" part
        "Basic !!!", f"Token {TOKEN}",
    ):  # fmt: skip
        assert not authorized(header, TOKEN), header


# -- read-only ------------------------------------------------------------------------


def test_read_only_shows_no_forms_and_refuses_every_post(reader: Console) -> None:
    console = reader
    for path in ("/entries", "/entries/report", "/entries/tick"):
        page = call(console, "GET", path, token=None)
        assert '<form method="post"' not in page.text, path
        assert "Set-Cookie" not in page.header
    for path in ("/entries/report/pause", "/entries/report/run", "/entries/pause"):
        reply = call(console, "POST", path, {"reason": "x", "name": "report"}, token=None)
        assert reply.status == 403 and "read-only" in reply.text
    assert not _paused(console)


def test_write_mode_without_a_token_is_read_only() -> None:
    """A console mounted in a WSGI server, where no start-up check ran."""
    for console in _console(leader_console_write=True):
        assert not console.write
        assert call(console, "POST", "/entries/report/pause", {"reason": "x"}).status == 403


# -- CSRF and Origin --------------------------------------------------------------------


def test_a_post_without_the_csrf_token_is_refused(writer: Console) -> None:
    console = writer
    cookie, token = _csrf(console)
    jar = {"Cookie": f"{CSRF_COOKIE}={cookie}"}
    for form, headers in (
        ({"reason": "forged"}, jar),  # no token in the form
        ({"reason": "forged", "csrf": token}, {}),  # no cookie
        ({"reason": "forged", "csrf": "0" * 64}, jar),  # a made-up token
        # A cookie planted by a sibling site, with a form field equal to it.
        ({"reason": "forged", "csrf": "planted"}, {"Cookie": f"{CSRF_COOKIE}=planted"}),
    ):
        reply = call(console, "POST", "/entries/report/pause", form, headers)
        assert reply.status == 403 and "CSRF" in reply.text
    assert not _paused(console)


def test_a_post_from_a_foreign_origin_is_refused(writer: Console) -> None:
    console = writer
    for origin in ("http://evil.example", "null", "http://127.0.0.1:6666"):
        reply = _post(console, "/entries/report/run", {}, origin=origin)
        assert reply.status == 403 and "another site" in reply.text, origin
    assert '"action": "run"' not in call(console, "GET", "/api/entries/report").text


def test_a_post_with_its_token_and_origin_pauses_and_resumes(writer: Console) -> None:
    console = writer
    assert _post(console, "/entries/report/pause", {"reason": ""}).status == 400  # a reason
    done = _post(console, "/entries/report/pause", {"reason": "billing  freeze"})
    assert done.status == 303 and done.header["Location"] == "/entries/report"
    assert _paused(console)
    audit = call(console, "GET", "/api/entries/report").text
    assert '"why": "billing freeze"' in audit and '"who": "console:token@127.0.0.1"' in audit
    assert _post(console, "/entries/report/resume", {}, origin=None).status == 303
    assert not _paused(console)


def test_run_now_asks_the_leader_and_refuses_a_code_entry(writer: Console) -> None:
    """No leader runs here: the request is queued for the next one, and the page says so."""
    console = writer
    page = call(console, "GET", "/entries/report").text
    key = re.search(r'name="key" value="([^"]+)"', page)
    assert key is not None
    done = _post(console, "/entries/report/run", {"key": key[1]})
    assert done.status == 303 and done.header["Location"] == "/entries/report?run=queued"
    assert "Run now: queued" in call(console, "GET", done.header["Location"]).text
    refused = _post(console, "/entries/tick/run", {})
    assert refused.status == 400 and "code entry" in refused.text
    assert _post(console, "/entries/tick/pause", {"reason": "noisy"}).status == 303
    assert '"enabled": false' in call(console, "GET", "/api/entries/tick").text


def test_a_bulk_pause_asks_for_a_confirmation(writer: Console) -> None:
    console = writer
    names = {"name": ["report", "tick"], "reason": "incident 42"}
    asked = _post(console, "/entries/pause", names)
    assert asked.status == 200 and "Pause 2 entries?" in asked.text
    assert 'name="confirm" value="yes"' in asked.text
    assert not _paused(console)
    done = _post(console, "/entries/pause", {**names, "confirm": "yes"})
    assert done.status == 303
    listed = call(console, "GET", "/api/entries?filter=paused").text
    assert '"total": 2' in listed
    assert listed.count('"why": "incident 42"') == 2, "each paused row says why"
    page = call(console, "GET", "/entries?filter=paused").text
    assert page.count("until resumed by console:token@127.0.0.1: incident 42") == 2


def test_a_large_body_is_refused_unread(writer: Console) -> None:
    console = writer
    cookie, token = _csrf(console)
    body = f"csrf={token}&reason=".encode() + b"x" * MAX_BODY
    headers = {"Cookie": f"{CSRF_COOKIE}={cookie}", "Origin": "http://" + HOST}
    reply = call(console, "POST", "/entries/report/pause", headers=headers, body=body)
    assert reply.status == 413
    assert not _paused(console)


def test_the_csrf_cookie_is_strict_and_hidden_from_scripts(writer: Console) -> None:
    console = writer
    cookie = call(console, "GET", "/entries").header["Set-Cookie"]
    assert "SameSite=Strict" in cookie and "HttpOnly" in cookie


# -- what pages show ------------------------------------------------------------------


def test_task_arguments_are_hidden_unless_asked_and_escaped(reader: Console) -> None:
    console = reader
    page = call(console, "GET", "/entries/report", token=None).text
    assert "acme" not in page and "show them" in page
    shown = call(console, "GET", "/entries/report?show=args", token=None).text
    assert "&lt;b&gt;acme" in shown or "\\u003cb\\u003eacme" in shown
    assert "<b>acme" not in shown
    assert "acme" not in call(console, "GET", "/api/entries/report", token=None).text


def test_methods_other_than_get_and_post_are_refused(reader: Console) -> None:
    console = reader
    assert call(console, "DELETE", "/entries/report", token=None).status == 405


# -- start-up -------------------------------------------------------------------------


def test_start_up_refuses_an_open_address_or_writing_without_a_token() -> None:
    with pytest.raises(ConfigError, match="not loopback"):
        check_start("0.0.0.0", False, None)
    with pytest.raises(ConfigError, match="leader_console_token is not set"):
        check_start("127.0.0.1", True, None)
    check_start("0.0.0.0", True, TOKEN)
    check_start("::1", False, None)
    check_start("localhost", False, None)


def test_the_token_is_never_in_the_settings_repr() -> None:
    app = _app(leader_console_token=TOKEN)
    assert TOKEN not in repr(app.config) and TOKEN not in repr(app.config.console)


def test_a_code_entry_with_a_free_text_name_is_shown_escaped(
    writer: Console,
) -> None:
    console = writer
    name = "add <b>every</b> 10 s/x"
    listed = call(console, "GET", "/entries").text
    assert "add &lt;b&gt;every&lt;/b&gt; 10 s/x" in listed and name not in listed
    assert 'href="/entries/add%20%3Cb%3Eevery%3C/b%3E%2010%20s/x"' in listed
    page = call(console, "GET", "/entries/" + name)
    assert page.status == 200
    # The store keeps names of letters, digits and _ . : - only: refused in one line.
    refused = _post(console, "/entries/" + name + "/pause", {"reason": "noisy"})
    assert refused.status == 400 and "&lt;b&gt;" in refused.text
    assert '"enabled": true' in call(console, "GET", "/api/entries/" + name).text


_WITHOUT_JINJA2 = """
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "jinja2":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Block())
import celery_leader.celery.cli  # every celery command loads it: no Jinja2 needed
from celery_leader import MissingExtra
try:
    import celery_leader.console
except MissingExtra as exc:
    print(exc)
"""


def test_without_its_extra_the_console_fails_in_one_line_naming_it() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_JINJA2], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "celery-leader needs 'jinja2' for this, and it is not installed: "
        "pip install 'celery-leader[console]'"
    ]


def test_the_footer_links_keep_what_the_page_shows(reader: Console) -> None:
    console = reader
    page = call(console, "GET", "/entries?q=rep&filter=paused", token=None).text
    assert 'href="/api/entries?q=rep&amp;filter=paused"' in page
    assert 'href="?q=rep&amp;filter=paused&amp;refresh=10"' in page
    refreshing = call(console, "GET", "/entries?q=rep&refresh=10", token=None).text
    assert 'data-refresh="10"' in refreshing and 'href="?q=rep">stop refreshing' in refreshing


def test_a_form_of_too_many_fields_is_refused(writer: Console) -> None:
    console = writer
    cookie, token = _csrf(console)
    body = f"csrf={token}&reason=x&".encode() + b"&".join(b"name=a" for _ in range(2000))
    headers = {"Cookie": f"{CSRF_COOKIE}={cookie}", "Origin": "http://" + HOST}
    assert call(console, "POST", "/entries/pause", headers=headers, body=body).status == 413


def test_a_pause_with_an_end_shows_it_and_the_slots_after_it(writer: Console) -> None:
    console = writer
    done = _post(
        console, "/entries/report/pause", {"reason": "freeze", "until": "2030-01-01T00:00:00Z"}
    )
    assert done.status == 303
    shown = json.loads(call(console, "GET", "/api/entries/report").text)
    assert shown["paused"] == {
        "who": "console:token@127.0.0.1", "why": "freeze", "until": "2030-01-01T00:00:00+00:00"
    }  # fmt: skip
    assert shown["next"][0]["utc"] == "2030-01-01T00:00:00+00:00"
    assert "Paused until 2030-01-01T00:00:00+00:00 by console:token@127.0.0.1: freeze" in (
        call(console, "GET", "/entries/report").text
    )
    refused = _post(console, "/entries/report/pause", {"reason": "x", "until": "soon"})
    assert refused.status == 400
