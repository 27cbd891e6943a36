"""The console in a real browser: Debian's chromium, driven by Selenium through
Debian's chromedriver, against ``celery ... leader console`` processes on a real
Redis with real beats and a worker. Each test asserts what the page shows and what
the broker and the worker got."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import redis
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
    env = {"CELERY_LEADER_CONSOLE_WRITE": "true", "CELERY_LEADER_CONSOLE_TOKEN": TOKEN}
    console = procs.spawn_python(CELERY_MAIN, *APP, "leader", "console", "--port", "0",
                                 env=_env(store_url, **(env if write else {})), cwd=ROOT)  # fmt: skip
    return _console_url(console)


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
