"""The console in a real browser: Debian's chromium, driven by Selenium through
Debian's chromedriver, against ``celery ... leader console`` processes on a real
Redis with real beats and a worker. Each test asserts what the page shows and what
the broker and the worker got."""

from __future__ import annotations

import base64
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import redis
from kombu import Connection, Exchange, Queue
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from harness.procs import Proc, Procs
from harness.waiting import wait_for
from tests.test_console_process import (
    APP,
    CELERY_MAIN,
    PASSWORD,
    ROOT,
    TOKEN,
    VIEWS,
    _celery,
    _console_url,
    _env,
    store_url,
)

__all__ = ["store_url"]  # the fixture, shared with the process tests

#: Debian's browser and its driver (scripts/setup.sh installs both). The driver is
#: named, so Selenium never looks for, nor downloads, one of its own.
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

Browser = Callable[..., WebDriver]


@pytest.fixture
def browser() -> Iterator[Browser]:
    """Opens headless chromiums: ``browser(javascript=False)`` with scripts off,
    ``browser(token=...)`` sending the token as a browser does once its user typed it
    into the basic-auth prompt."""
    opened: list[WebDriver] = []

    def open_browser(*, javascript: bool = True, token: str | None = None) -> WebDriver:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        # As root, chromium runs only without its sandbox.
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
            options.add_argument(arg)
        if not javascript:
            options.add_experimental_option(
                "prefs", {"profile.managed_default_content_settings.javascript": 2}
            )
        driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
        opened.append(driver)
        if token is not None:
            credentials = base64.b64encode(f"ops:{token}".encode()).decode()
            driver.execute_cdp_cmd("Network.enable", {})
            driver.execute_cdp_cmd(
                "Network.setExtraHTTPHeaders",
                {"headers": {"Authorization": f"Basic {credentials}"}},
            )
        return driver

    yield open_browser
    for driver in opened:
        driver.quit()


def _beat(procs: Procs, store_url: str, name: str = "beat-1", **env: str) -> Proc:
    return procs.spawn_python(CELERY_MAIN, *APP, "beat", "-S", "leader", "-l", "info",
                              env=_env(store_url, INSTANCE_ID=name, **env), cwd=ROOT)  # fmt: skip


def _worker(procs: Procs, store_url: str) -> Proc:
    worker = procs.spawn_python(
        CELERY_MAIN, *APP, "worker", "-P", "solo", "-n", "w1@%h", "-l", "INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        env=_env(store_url), cwd=ROOT,
    )  # fmt: skip
    worker.wait_for_line(r"ready\.", 60)
    return worker


def _console(procs: Procs, store_url: str, *, write: bool = False) -> str:
    mode = {"CELERY_LEADER_CONSOLE_WRITE": "true", "CELERY_LEADER_CONSOLE_TOKEN": TOKEN}
    env = _env(store_url, **(mode if write else {}))
    console = procs.spawn_python(CELERY_MAIN, *APP, "leader", "console", "--port", "0",
                                 env=env, cwd=ROOT)  # fmt: skip
    return _console_url(console)


def _tap(store_url: str) -> None:
    """Binds the ``celery`` queue to the exchange the beats publish through, beside the
    worker's own queue, so that it keeps a copy of every message for ``_sent``."""
    with Connection(store_url) as connection:
        queue = Queue("celery", Exchange("celery"), routing_key="celery")
        queue(connection.default_channel).declare()


def _sent(store_url: str) -> list[tuple[str, int]]:
    """Every ``(leader_slot, leader_epoch)`` the beats published, oldest first: the
    copies in the ``celery`` queue, which nobody consumes (the worker reads its own)."""
    with redis.Redis.from_url(store_url) as client:
        raws = list(reversed(client.lrange("celery", 0, -1)))  # kombu LPUSHes
    headers = [json.loads(raw)["headers"] for raw in raws]
    return [(h["leader_slot"], int(h["leader_epoch"])) for h in headers if h.get("leader_slot")]


def _ran(store_url: str) -> list[str]:
    """The ``leader_slot`` of every run the worker's task body made, oldest first."""
    with redis.Redis.from_url(store_url) as client:
        return [json.loads(raw)["slot"] for raw in client.lrange("runs", 0, -1)]


def _due(slot: str) -> float:
    """A scheduled slot's due time, ``NAME@<ISO time>``, as a UNIX time."""
    return datetime.fromisoformat(slot.rpartition("@")[2]).timestamp()


def _text(driver: WebDriver, css: str = "main") -> str:
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def _until(driver: WebDriver, url: str, shown: Callable[[WebDriver], bool], timeout: float,
           message: str) -> None:  # fmt: skip
    """Reload ``url`` until ``shown`` holds, as an operator reloads a page."""

    def reloaded(driver: WebDriver) -> bool:
        driver.get(url)
        return shown(driver)

    WebDriverWait(driver, timeout, poll_frequency=0.5).until(reloaded, message)


def test_read_only_pages_render_with_javascript_off_and_show_no_forms(
    procs: Procs, store_url: str, browser: Browser
) -> None:
    added = _celery(store_url, "leader", "entries", "add", "report", "--task", "beat_app.noop",
                    "--every", "3600")  # fmt: skip
    assert added.returncode == 0, added.stderr
    _beat(procs, store_url)
    url = _console(procs, store_url)
    driver = browser(javascript=False)
    driver.get("data:text/html,<noscript>scripts are off</noscript>")
    assert _text(driver, "body") == "scripts are off"

    _until(driver, url, lambda d: "beat-1" in _text(d), 30, "beat-1 never led on the page")
    for view in VIEWS:
        driver.get(url + view)
        assert driver.title.endswith("- celery-leader console"), view
        assert driver.find_element(By.TAG_NAME, "h1").text, view
        assert _text(driver, "header .mode") == "read-only", view
        methods = [f.get_dom_attribute("method") for f in driver.find_elements(By.TAG_NAME, "form")]
        assert all((method or "get").lower() == "get" for method in methods), (view, methods)
        assert PASSWORD not in driver.page_source
    driver.get(url + "entries")
    assert {"report", "tick"} <= set(_text(driver).split())
    driver.get(url + "entries/report")
    assert "Actions" not in _text(driver) and "Run now" not in driver.page_source


def test_pausing_from_the_page_stops_its_slots_within_one_tick(
    procs: Procs, store_url: str, browser: Browser
) -> None:
    """``tick`` and ``tick1`` fall due every second; ``tick`` is paused from its page
    (with scripts off: the forms are plain HTML). ``tick1`` goes on, so its slots mark
    the time that passes; ``tick``'s stop within one period of the pause."""
    _tap(store_url)
    _worker(procs, store_url)
    beat = _beat(procs, store_url, BEAT_ENTRIES="2")
    url = _console(procs, store_url, write=True)
    wait_for(lambda: any(s.startswith("tick@") for s in _ran(store_url)), 30,
             message=lambda: f"the worker never ran tick: {beat.output()[-3000:]}")  # fmt: skip
    driver = browser(javascript=False, token=TOKEN)
    driver.get(url + "entries/tick")
    assert _text(driver, "header .mode") == "write mode"
    driver.find_element(By.NAME, "reason").send_keys("quarter close")
    before = time.time()
    driver.find_element(By.XPATH, "//button[text()='Pause']").click()
    WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "h1 .paused"))
    paused = time.time()
    assert before <= paused
    assert "Paused until resumed by console:ops@127.0.0.1: quarter close" in _text(driver)
    assert "none (paused)" in _text(driver)
    audit = _text(driver, "main table:last-of-type tbody tr")
    assert "console:ops@127.0.0.1" in audit and "pause" in audit and "quarter close" in audit

    # Three periods of tick1 after the pause, tick sent nothing due past one period.
    wait_for(lambda: any(s.startswith("tick1@") and _due(s) > paused + 3 for s, _ in
                         _sent(store_url)), 30, message="tick1 stopped too")  # fmt: skip
    ticks = [_due(slot) for slot, _ in _sent(store_url) if slot.startswith("tick@")]
    assert ticks and max(ticks) <= paused + 1, (paused, ticks[-5:])
    assert all(_due(slot) <= paused + 1 for slot in _ran(store_url) if slot.startswith("tick@"))


def test_run_now_from_the_page_runs_once_under_the_leaders_epoch(
    procs: Procs, store_url: str, browser: Browser
) -> None:
    added = _celery(store_url, "leader", "entries", "add", "report", "--task", "beat_app.noop",
                    "--every", "3600")  # fmt: skip
    assert added.returncode == 0, added.stderr
    _tap(store_url)
    _worker(procs, store_url)
    beat = _beat(procs, store_url)
    url = _console(procs, store_url, write=True)
    driver = browser(token=TOKEN)

    def leader_row(driver: WebDriver) -> list[str]:
        rows = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
                for tr in driver.find_elements(By.CSS_SELECTOR, "main tbody tr")]  # fmt: skip
        return next((row for row in rows if row[0] == "beat" and row[1] == "beat-1"), [])

    _until(driver, url, lambda d: bool(leader_row(d)), 30, "beat-1 never led on the page")
    epoch = int(leader_row(driver)[2])
    driver.get(url + "entries/report")
    driver.find_element(By.XPATH, "//button[text()='Run now']").click()
    WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "p.notice"))
    assert _text(driver, "p.notice") == "Run now: sent by the leader.", beat.output()[-3000:]

    def runs_now() -> list[str]:
        return [slot for slot in _ran(store_url) if slot.startswith("report@run:")]

    wait_for(runs_now, 30, message=lambda: f"the worker never ran it: {beat.output()[-3000:]}")
    sent = [(slot, e) for slot, e in _sent(store_url) if slot.startswith("report@run:")]
    assert sent == [(runs_now()[0], epoch)] and len(runs_now()) == 1

    def in_history(driver: WebDriver) -> bool:
        rows = driver.find_elements(By.XPATH, "//tr[td[contains(@title, '@run:')]]")
        return any("success" in row.text for row in rows)

    _until(driver, url + "entries/report", in_history, 30, "the run never showed in its history")
    audit = _text(driver, "main table:last-of-type tbody tr")
    assert "console:ops@127.0.0.1" in audit and "run" in audit


class _ForgingSite(BaseHTTPRequestHandler):
    """Another origin's page: a form that posts a pause to the console, with the
    victim's own CSRF token copied in (as if it had leaked), so only the console's
    ``Origin`` check stands in its way."""

    page = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test's output is the console's and the beats'."""


@pytest.fixture
def forging_site() -> Iterator[Callable[[str], str]]:
    """``forging_site(html)`` serves ``html`` at its own origin and returns its URL."""
    servers: list[ThreadingHTTPServer] = []

    def serve(html: str) -> str:
        handler = type("Site", (_ForgingSite,), {"page": html.encode()})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_forged_cross_site_post_is_refused(
    procs: Procs, store_url: str, browser: Browser, forging_site: Callable[[str], str]
) -> None:
    added = _celery(store_url, "leader", "entries", "add", "report", "--task", "beat_app.noop",
                    "--every", "3600")  # fmt: skip
    assert added.returncode == 0, added.stderr
    url = _console(procs, store_url, write=True)
    driver = browser(token=TOKEN)
    driver.get(url + "entries/report")
    csrf = driver.find_element(By.CSS_SELECTOR, "form input[type=hidden]")
    field, value = csrf.get_dom_attribute("name"), csrf.get_dom_attribute("value")
    # Another port of the same host: another origin but the same site, so even the
    # SameSite=Strict cookie goes along with the form.
    evil = forging_site(
        f'<form method="post" action="{url}entries/report/pause">'
        f'<input type="hidden" name="{field}" value="{value}">'
        '<input type="hidden" name="reason" value="forged">'
        '<button type="submit">Win a prize</button></form>'
    )
    driver.get(evil)
    driver.find_element(By.TAG_NAME, "button").click()
    WebDriverWait(driver, 10).until(lambda d: d.current_url.startswith(url))
    assert driver.title.startswith("403"), driver.page_source
    assert _text(driver, "p.error") == "refused: the form came from another site"
    driver.get(url + "entries/report")
    assert _text(driver, "h1 .badge") == "enabled"
    audit = _text(driver, "main table:last-of-type tbody")
    assert "pause" not in audit and "forged" not in audit, audit
    listed = _celery(store_url, "leader", "entries", "ls", "--json")
    assert '"enabled": false' not in listed.stdout and "forged" not in listed.stdout


def test_a_sigkill_hand_over_shows_on_the_timeline_with_its_gap_and_slots(
    procs: Procs, store_url: str, browser: Browser
) -> None:
    beats = {name: _beat(procs, store_url, name) for name in ("beat-1", "beat-2")}
    url = _console(procs, store_url)
    driver = browser(javascript=False)

    def terms(driver: WebDriver) -> list[list[str]]:
        return [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
                for tr in driver.find_elements(By.CSS_SELECTOR, "main tbody tr")]  # fmt: skip

    _until(driver, url + "timeline", lambda d: terms(d)[0][4] == "leading", 30,
           "no leader's term on the timeline")  # fmt: skip
    [[epoch, holder, started, *_]] = terms(driver)
    # Longer than a ttl in office, so that the gap's bound is the ttl, not the term.
    since = datetime.fromisoformat(started).timestamp()
    wait_for(lambda: time.time() > since + 4, 10, message="the clock stood still")
    beats[holder].signal(signal.SIGKILL)
    _until(driver, url + "timeline", lambda d: len(terms(d)) == 2, 30,
           "no hand-over on the timeline")  # fmt: skip
    newest, lost = terms(driver)
    assert lost[:2] == [epoch, holder] and lost[3:5] == ["-", "lost"]
    assert newest[1] != holder and newest[4] == "leading"
    assert newest[5] == "at most 3.000 s"
    slots = driver.find_elements(By.CSS_SELECTOR, "main tbody tr:first-child td:last-child div")
    assert len(slots) == 3, newest
    for slot in slots:
        assert slot.text.startswith("tick@") and ": " in slot.text
        link = slot.find_element(By.TAG_NAME, "a")
        assert link.get_dom_attribute("href") == "/entries/tick"
