"""``celery -A app leader console`` and ``python -m celery_leader console MODULE`` as
operators run them: real processes on a real Redis, a real beat leading, every view
and its JSON twin fetched over HTTP."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import redis
import requests

from harness.procs import Proc, Procs
from harness.servers import RedisServer
from harness.waiting import wait_for
from tests.test_run_now import DRAMATIQ, SCHEDULER, YEAR, _leader

ROOT = Path(__file__).resolve().parent.parent
CELERY_MAIN = "from celery.__main__ import main; main()"
PYTHON_MAIN = "import sys; from celery_leader.__main__ import main; sys.exit(main())"
APP = ["-A", "tests.apps.beat_app"]
TOKEN = "console-t0ken"
PASSWORD = "st0re-pw"
CSP = "default-src 'self'; frame-ancestors 'none'"
#: The pages and their JSON twins, each at a stable URL.
VIEWS = ["", "entries", "entries/report", "entries/tick", "timeline", "problems", "plan"]
TWINS = ["cluster", "entries", "entries/report", "entries/tick", "timeline", "problems", "plan"]


@pytest.fixture
def store_url(redis_server: RedisServer, redis_url: str) -> str:
    """The test Redis, reached with a password that no log line or page may show."""
    with redis_server.client() as client:
        client.acl_setuser("console", enabled=True, passwords=[f"+{PASSWORD}"], keys="*",
                           channels="*", commands=["+@all"])  # fmt: skip
    return redis_url.replace("redis://", f"redis://console:{PASSWORD}@")


def _env(store_url: str, **more: str) -> dict[str, str]:
    """The test app's settings: beat sends ``tick`` every second, through the exchange
    that the worker's queue is bound to, and the worker runs it."""
    return {
        "PYTHONPATH": str(ROOT),
        "BROKER_URL": store_url,
        "LEADER_URL": store_url,
        "LEADER_TTL": "3",
        "BEAT_EVERY": "1",
        "RUNS_URL": store_url,
        "VIA_EXCHANGE": "1",
        **more,
    }


def _celery(store_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CELERY_MAIN, *APP, *args],
        env={**os.environ, **_env(store_url, **env)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _console_url(proc: Proc) -> str:
    return proc.wait_for_line(r"console at (http://\S+/)", timeout=30)[1]


def _submit(
    web: requests.Session, url: str, entry: str, action: str, **fields: str
) -> requests.Response:
    """Post ``action`` on ``entry``'s page as a browser does: the page's form token, the
    session's cookie, and the page's Origin."""
    page = web.get(f"{url}entries/{entry}", timeout=10).text
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert token is not None, "write mode shows the forms"
    return web.post(
        f"{url}entries/{entry}/{action}",
        data={"csrf": token[1], **fields},
        headers={"Origin": url.rstrip("/")},
        allow_redirects=False,
        timeout=10,
    )


def test_celery_console_serves_every_view_and_its_json_twin(procs: Procs, store_url: str) -> None:
    added = _celery(store_url, "leader", "entries", "add", "report", "--task", "beat_app.noop",
                    "--every", "3600")  # fmt: skip
    assert added.returncode == 0, added.stderr
    worker = procs.spawn_python(
        CELERY_MAIN, *APP, "worker", "-P", "solo", "-n", "w1@%h", "-l", "INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        env=_env(store_url), cwd=ROOT,
    )  # fmt: skip
    worker.wait_for_line(r"ready\.", 60)
    beat = procs.spawn_python(CELERY_MAIN, *APP, "beat", "-S", "leader", "-l", "info",
                              env=_env(store_url, INSTANCE_ID="beat-1"), cwd=ROOT)  # fmt: skip
    console = procs.spawn_python(
        CELERY_MAIN, *APP, "leader", "console", "--port", "0",
        env=_env(store_url, CELERY_LEADER_CONSOLE_WRITE="true",
                 CELERY_LEADER_CONSOLE_TOKEN=TOKEN),
        cwd=ROOT,
    )  # fmt: skip
    url = _console_url(console)
    assert url.startswith("http://127.0.0.1:")
    web = requests.Session()
    web.auth = ("ops", TOKEN)

    def holder() -> str | None:
        rows = web.get(url + "api/cluster", timeout=10).json()["elections"]
        return next((r["holder"] for r in rows if r["election"] == "beat"), None)

    wait_for(lambda: holder() == "beat-1", 30, message=f"beat never led: {beat.output()}")
    assert requests.get(url + "api/cluster", timeout=10).status_code == 401  # no token
    for view, twin in zip(VIEWS, TWINS, strict=True):
        page = web.get(url + view, timeout=10)
        assert page.status_code == 200, (view, page.text)
        assert page.headers["Content-Security-Policy"] == CSP
        assert page.headers["Cache-Control"] == "no-store"
        assert PASSWORD not in page.text
        data = web.get(url + "api/" + twin, timeout=10)
        assert data.status_code == 200 and data.headers["Content-Type"] == "application/json"
        assert PASSWORD not in data.text
    entries = web.get(url + "api/entries", timeout=10).json()
    assert {(e["name"], e["source"]) for e in entries["entries"]} == {
        ("report", "store"),
        ("tick", "code"),
    }
    assert all(len(e["next"]) == 3 for e in entries["entries"])
    assert "beat-1" in web.get(url, timeout=10).text
    rows = web.get(url + "api/cluster", timeout=10).json()["elections"]
    replicas = next(r["replicas"] for r in rows if r["election"] == "beat")
    assert [(r["instance"], r["leads"], r["last_how"]) for r in replicas] == [
        ("beat-1", True, "leading")
    ]
    assert "<h2>Replicas</h2>" in web.get(url, timeout=10).text

    def ran() -> bool:
        runs = web.get(url + "api/entries/tick", timeout=10).json()["runs"]
        return len([r for r in runs if r["state"] == "success"]) >= 2

    wait_for(ran, 30, message="the tick entry's runs never showed in its history")
    tick = web.get(url + "api/entries/tick", timeout=10).json()
    run = next(r for r in tick["runs"] if r["state"] == "success")
    assert run["worker"] and run["attempt"] == 1 and run["duration"] is not None
    assert run["due"] is not None and run["lag"] is not None and tick["p50"] is not None
    leading = web.get(url + "api/cluster", timeout=10).json()["elections"]
    assert run["epoch"] == next(r["epoch"] for r in leading if r["election"] == "beat")
    assert f"<td>{run['epoch']}</td>" in web.get(url + "entries/tick", timeout=10).text
    terms = web.get(url + "api/timeline", timeout=10).json()["terms"]
    assert terms and terms[0]["holder"] == "beat-1" and terms[0]["how"] == "leading"

    # A pause from the page, as a browser sends it: cookie, form token, Origin.
    done = _submit(web, url, "report", "pause", reason="quarter close")
    assert done.status_code == 303, done.text
    shown = web.get(url + "api/entries/report", timeout=10).json()
    assert shown["enabled"] is False and shown["state"] == "paused"
    assert shown["audit"][0]["action"] == "pause" and shown["audit"][0]["why"] == "quarter close"
    listed = _celery(store_url, "leader", "entries", "ls", "--json")
    assert '"enabled": false' in listed.stdout, "the CLI sees the page's pause"

    # Run now goes through the leader, which sends it under its term; the worker runs it.
    done = _submit(web, url, "report", "run", key="console-run-1")
    assert done.headers["Location"].endswith("?run=sent"), beat.output()[-3000:]

    def report_ran() -> bool:
        runs = web.get(url + "api/entries/report", timeout=10).json()["runs"]
        return any(run["state"] == "success" and "@run:" in run["slot"] for run in runs)

    wait_for(report_ran, 30, message="the run now never showed in the entry's history")
    audit = web.get(url + "api/entries/report", timeout=10).json()["audit"]
    assert audit[0]["action"] == "run" and audit[0]["who"].startswith("console:ops@")

    console.signal(signal.SIGTERM)
    assert console.wait(15) == 0
    assert PASSWORD not in console.output() and TOKEN not in console.output()


def test_the_console_refuses_an_open_address_without_a_token(store_url: str) -> None:
    refused = _celery(store_url, "leader", "console", "--bind", "0.0.0.0", "--port", "0")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "Error: the console does not listen on 0.0.0.0 (not loopback) without an "
        "authenticator: set leader_console_token, or bind 127.0.0.1"
    ]
    refused = _celery(store_url, "leader", "console", CELERY_LEADER_CONSOLE_WRITE="1")
    assert refused.returncode == 2 and "leader_console_token is not set" in refused.stderr


def test_dramatiq_console_serves_its_entries(procs: Procs, store_url: str) -> None:
    console = procs.spawn_python(
        PYTHON_MAIN, "console", "tests.apps.dramatiq_app", "--port", "0",
        env=_env(store_url), cwd=ROOT,
    )  # fmt: skip
    url = _console_url(console)
    for view in VIEWS[:2] + VIEWS[4:]:
        assert requests.get(url + view, timeout=10).status_code == 200, view
    names = {e["name"] for e in requests.get(url + "api/entries", timeout=10).json()["entries"]}
    assert "tick" in names
    assert requests.post(url + "entries/tick/pause", timeout=10).status_code == 403  # read-only
    console.signal(signal.SIGTERM)
    assert console.wait(15) == 0
    assert PASSWORD not in console.output()


def test_a_hand_over_shows_on_the_timeline_with_its_gap_and_slots(
    procs: Procs, store_url: str
) -> None:
    """The leader is SIGKILLed: the next one records its term as lost, and the timeline
    shows the gap between the two terms with the slots due in it."""
    beat = [*APP, "beat", "-S", "leader", "-l", "info"]
    beats = {
        name: procs.spawn_python(CELERY_MAIN, *beat, env=_env(store_url, INSTANCE_ID=name))
        for name in ("beat-1", "beat-2")
    }
    console = procs.spawn_python(CELERY_MAIN, *APP, "leader", "console", "--port", "0",
                                 env=_env(store_url), cwd=ROOT)  # fmt: skip
    url = _console_url(console)

    def terms() -> list[dict[str, object]]:
        found: list[dict[str, object]] = requests.get(url + "api/timeline", timeout=10).json()[
            "terms"
        ]
        return found

    wait_for(lambda: len(terms()) == 1, 30, message="no leader's term was recorded")
    first = terms()[0]
    since = datetime.fromisoformat(str(first["started"])).timestamp()
    # Longer than a ttl in office, so that the gap's bound is the ttl, not the term.
    wait_for(lambda: time.time() > since + 4, 10, message="the clock stood still")
    beats[str(first["holder"])].signal(signal.SIGKILL)
    wait_for(lambda: len(terms()) == 2 and terms()[1]["how"] == "lost", 30,
             message=lambda: f"no hand-over on the timeline: {terms()}")  # fmt: skip
    newest, lost = terms()
    assert lost["epoch"] == first["epoch"] and lost["ended"] is None
    assert newest["holder"] != first["holder"] and newest["how"] == "leading"
    assert (newest["gap"], newest["gap_exact"]) == (3.0, False)
    slots = newest["gap_slots"]
    assert isinstance(slots, list) and [slot["entry"] for slot in slots] == ["tick"] * 3
    page = requests.get(url + "timeline", timeout=10).text
    assert "lost" in page and str(newest["holder"]) in page


def test_dramatiq_run_now_from_the_console_goes_through_its_leader(
    procs: Procs, store_url: str
) -> None:
    """Over HTTP, as a browser posts the form (a browser adds nothing the Celery browser
    tests do not show): the console of a Dramatiq app lists its entries, and run now is
    sent by the leading scheduler replica under its epoch, run once by a worker, and
    shown in the entry's history with that epoch and in its audit trail."""
    app = "tests.apps.ledger_dramatiq"
    env = {
        "PYTHONPATH": str(ROOT), "BROKER_URL": store_url, "STORE_URL": store_url,
        "CELERY_LEADER_LEDGER": "1", "CELERY_LEADER_TTL": "2", "EVERY": YEAR,
        "CELERY_LEADER_CONSOLE_WRITE": "true", "CELERY_LEADER_CONSOLE_TOKEN": TOKEN,
    }  # fmt: skip
    added = subprocess.run(
        [sys.executable, "-m", "celery_leader", "entries", "--app", app, "add", "report",
         "--task", "work", "--every", YEAR],
        env={**os.environ, **env}, cwd=ROOT, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    worker = procs.spawn_python(DRAMATIQ, app, "-p", "1", "-t", "2", env=env, cwd=ROOT)
    worker.wait_for_line(r"Worker process is ready|is ready for action", 60)
    schedulers = [procs.spawn_python(SCHEDULER, app, env=env, cwd=ROOT) for _ in range(2)]
    leader, epoch = _leader(schedulers)
    console = procs.spawn_python(PYTHON_MAIN, "console", app, "--port", "0", env=env, cwd=ROOT)
    url = _console_url(console)
    web = requests.Session()
    web.auth = ("ops", TOKEN)
    listed = web.get(url + "api/entries", timeout=10).json()["entries"]
    assert [(e["name"], e["source"]) for e in listed] == [("report", "store"), ("tick", "code")]
    cluster = web.get(url + "api/cluster", timeout=10).json()["elections"]
    beat = next(row for row in cluster if row["election"] == "beat")
    assert beat["epoch"] == epoch and beat["replicas"][0]["leads"]

    done = _submit(web, url, "report", "run", key="dramatiq-run-1")
    assert done.status_code == 303 and done.headers["Location"].endswith("?run=sent"), (
        done.text, leader.output()[-3000:]
    )  # fmt: skip
    asked = r"sending slot (report@run:\S+) \(epoch (\d+)\): run-now request dramatiq-run-1"
    sent = re.search(asked, leader.output())
    assert sent is not None and int(sent[2]) == epoch, leader.output()[-3000:]
    for other in schedulers:
        assert other is leader or "run-now request" not in other.output()

    def ran() -> dict[str, object] | None:
        runs = web.get(url + "api/entries/report", timeout=10).json()["runs"]
        return next((r for r in runs if r["slot"] == sent[1] and r["state"] == "success"), None)

    run = wait_for(ran, 30, message="the run now never showed in the entry's history")
    assert run["epoch"] == epoch and run["attempt"] == 1
    bodies = redis.Redis.from_url(store_url, decode_responses=True).lrange("runs", 0, -1)
    assert [json.loads(b)["slot"] for b in bodies] == [sent[1]], "ran once"
    audit = web.get(url + "api/entries/report", timeout=10).json()["audit"]
    assert audit[0]["action"] == "run" and audit[0]["who"].startswith("console:ops@")
