"""Screenshots of the console's views, taken from a real run: ``docs/img/console-*.png``.

    .venv/bin/python scripts/screenshots.py        # about 2 minutes

It starts its own redis-server on a free loopback port (through ``harness``), three
beat replicas and a worker of a small shop (``scripts/screenshots_shop.py``), adds
store entries (one paused with a reason, one whose task always fails, one sent to a
queue no worker reads, so it runs late, one that overruns its maximum runtime), lets
their slots run, SIGKILLs the leader once so that the timeline shows a hand-over and
its gap (and has the next leader resign), then opens each view of ``leader console``
in Debian's headless chromium (``scripts/setup.sh`` installs it) and saves it as a
small palette PNG. Everything it started is stopped at the end, also on failure or
Ctrl-C.
"""

from __future__ import annotations

import base64
import io
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import requests
from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the harness, when run as a script

from harness.procs import Proc, spawn_python  # noqa: E402
from harness.servers import RedisServer  # noqa: E402
from harness.waiting import wait_for  # noqa: E402

OUT = ROOT / "docs" / "img"
CELERY_MAIN = "from celery.__main__ import main; main()"
APP = ["-A", "screenshots_shop"]
#: Debian's browser and its driver, named so that Selenium never fetches its own.
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: The window: 1280 px wide, and as tall as the page up to :data:`HEIGHT` (the plan,
#: say, goes on for hundreds of rows).
WIDTH, HEIGHT = 1280, 1500
#: Colours per PNG: the pages are text on flat colours, so a small palette keeps
#: them sharp at a fraction of the size.
COLOURS = 128
TTL = 5
#: The console's token (write mode, so the pages show their forms), new for each run.
TOKEN = secrets.token_hex(16)
#: Who the audit trail names for the script's edits.
WHO = "alice"
#: How long the slots run before and after the leader is killed, in seconds.
BEFORE_KILL = 50
AFTER_KILL = 40

#: The store entries: name, then the ``leader entries add`` options.
ENTRIES: list[tuple[str, list[str]]] = [
    ("refresh-prices", ["--task", "shop.refresh_prices", "--every", "3",
                        "--kwargs", '{"currency": "EUR"}', "--late-after", "10"]),
    ("sync-inventory", ["--task", "shop.sync_inventory", "--every", "8",
                        "--kwargs", '{"warehouse": "lyon"}', "--late-after", "15",
                        "--max-runtime", "30"]),
    ("send-invoices", ["--task", "shop.send_invoices", "--cron", "* * * * *",
                       "--tz", "Europe/Paris", "--late-after", "30"]),
    ("import-supplier-feed", ["--task", "shop.import_supplier_feed", "--every", "12",
                              "--kwargs", '{"supplier": "acme-textiles"}']),
    ("rebuild-search-index", ["--task", "shop.rebuild_search_index", "--every", "60",
                              "--max-runtime", "20"]),
    ("export-orders", ["--task", "shop.export_orders", "--every", "20", "--queue", "warehouse",
                       "--late-after", "3"]),
    ("quarterly-report", ["--task", "shop.quarterly_report", "--cron", "0 6 1 1,4,7,10 *",
                          "--tz", "America/New_York"]),
    # Its next slot falls in the hour that Berlin's clocks skip in March 2027.
    ("archive-fiscal-year", ["--task", "shop.quarterly_report", "--cron", "30 2 28 3 *",
                             "--tz", "Europe/Berlin"]),
]  # fmt: skip

#: The views, as ``docs/img/console-<name>.png``: name, path. The problems first, while
#: they show the states the script waited for.
VIEWS = [
    ("problems", "problems"),
    ("cluster", ""),
    ("timeline", "timeline"),
    ("entries", "entries"),
    # Its eight newest runs, so that its audit trail is on the picture too.
    ("entry", "entries/sync-inventory?runs=8"),
    ("plan", "plan"),
]
#: The states the problems view shows before the screenshots are taken.
STATES = {"failed", "late", "overrun", "paused"}

T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - T0:5.1f}s] {text}", flush=True)


class Run:
    """The processes of one run, on one Redis."""

    def __init__(self, redis_url: str, logs: Path) -> None:
        self.logs = logs
        self.env = {
            "PYTHONPATH": os.pathsep.join([str(ROOT / "scripts"), str(ROOT)]),
            "BROKER_URL": redis_url,
            "LEADER_URL": redis_url,
            "LEADER_TTL": str(TTL),
        }
        self.procs: list[Proc] = []
        self.beats: dict[str, Proc] = {}

    def spawn(self, *args: str, **env: str) -> Proc:
        proc = spawn_python(CELERY_MAIN, *APP, *args, env={**self.env, **env}, cwd=ROOT,
                            log_dir=self.logs)  # fmt: skip
        self.procs.append(proc)
        return proc

    def celery(self, *args: str) -> str:
        """``celery -A screenshots_shop ARGS``, to its end; its output."""
        done = subprocess.run(
            [sys.executable, "-c", CELERY_MAIN, *APP, *args],
            env={**os.environ, **self.env},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    def entries(self, *args: str) -> None:
        self.celery("leader", "entries", *args, "--who", WHO)

    def beat(self, name: str) -> None:
        self.beats[name] = self.spawn("beat", "-S", "leader", "-l", "info", INSTANCE_ID=name)

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill_group()


class Console:
    """``leader console`` in write mode, read through its JSON twins."""

    def __init__(self, run: Run) -> None:
        proc = run.spawn("leader", "console", "--port", "0",
                         CELERY_LEADER_CONSOLE_WRITE="true",
                         CELERY_LEADER_CONSOLE_TOKEN=TOKEN)  # fmt: skip
        self.url = proc.wait_for_line(r"console at (http://\S+/)", timeout=60)[1]
        self.web = requests.Session()
        self.web.auth = ("ops", TOKEN)

    def api(self, path: str) -> Any:
        answer = self.web.get(self.url + "api/" + path, timeout=10)
        answer.raise_for_status()
        return answer.json()

    def holder(self) -> str | None:
        rows = self.api("cluster")["elections"]
        return next((row["holder"] for row in rows if row["election"] == "beat"), None)


@contextmanager
def chromium() -> Iterator[WebDriver]:
    """Headless chromium, sending the console's token."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # As root, chromium runs only without its sandbox.
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        credentials = base64.b64encode(f"ops:{TOKEN}".encode()).decode()
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd(
            "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {credentials}"}}
        )
        yield driver
    finally:
        driver.quit()


#: How tall the page's content is, in CSS pixels.
TALL = "return Math.ceil(document.body.getBoundingClientRect().height)"


def resize(driver: WebDriver, width: int, height: int) -> None:
    """The page's viewport, exactly ``width`` by ``height`` (the window's frame aside)."""
    metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)


def small_png(png: bytes) -> bytes:
    """``png`` with a palette of :data:`COLOURS`, compressed as far as Pillow goes."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    palette = image.quantize(colors=COLOURS, dither=Image.Dither.NONE)
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True)
    return out.getvalue()


def shoot(console: Console) -> None:
    """Each view, saved as ``docs/img/console-<view>.png``."""
    OUT.mkdir(parents=True, exist_ok=True)
    # The next ten minutes, in the zone of the invoices' schedule.
    until = (datetime.now(timezone.utc) + timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    plan = f"?to={until}&tz=Europe/Paris"
    with chromium() as driver:
        for name, path in VIEWS:
            resize(driver, WIDTH, HEIGHT)
            driver.get(console.url + path + (plan if name == "plan" else ""))
            resize(driver, WIDTH, min(HEIGHT, driver.execute_script(TALL)))
            target = OUT / f"console-{name}.png"
            target.write_bytes(small_png(driver.get_screenshot_as_png()))
            say(f"{target.relative_to(ROOT)}: {target.stat().st_size // 1024} KiB")


def play(run: Run) -> Console:
    """The run: entries, beats, a worker, edits, a SIGKILLed leader."""
    for name, options in ENTRIES:
        run.entries("add", name, *options)
    run.entries("pause", "quarterly-report", "--reason",
                "finance freezes the numbers until the audit ends",
                "--until", "2027-01-04T09:00:00Z")  # fmt: skip
    say(f"{len(ENTRIES)} store entries added")
    worker = run.spawn("worker", "-P", "threads", "-c", "4", "-n", "shop-worker-1@%h",
                       "-l", "INFO", "--without-gossip", "--without-mingle")  # fmt: skip
    worker.wait_for_line(r"ready\.", 60)
    for n in (1, 2, 3):
        run.beat(f"beat-{n}")
    console = Console(run)
    say(f"console at {console.url}")
    leader = wait_for(console.holder, 60, message="no beat replica ever led")
    say(f"{leader} leads; the slots run for {BEFORE_KILL} s")

    time.sleep(BEFORE_KILL / 2)  # a lower bound: at least this much history
    # An operator pauses sync-inventory for a while, then resumes it.
    run.entries("pause", "sync-inventory", "--reason", "Lyon warehouse moves its stock system")
    time.sleep(10)
    run.entries("resume", "sync-inventory")
    time.sleep(BEFORE_KILL / 2 - 10)

    run.beats[leader].signal(signal.SIGKILL)
    say(f"{leader} killed (SIGKILL)")
    successor = wait_for(lambda: (h := console.holder()) not in (None, leader) and h,
                         3 * TTL, message="nobody took over")  # fmt: skip
    say(f"{successor} took over; {leader} restarts")
    run.beat(leader)
    time.sleep(AFTER_KILL / 2)
    run.celery("leader", "resign")
    say(f"{successor} resigned")
    # ... and runs sync-inventory once now, through the new leader.
    run.entries("run", "sync-inventory", "--why", "stock counts looked wrong")
    time.sleep(AFTER_KILL / 2)
    return console


def states(console: Console) -> dict[str, str]:
    """Each entry not on time, and its state."""
    return {row["name"]: row["state"] for row in console.api("problems")["entries"]}


def main() -> int:
    logs = Path(tempfile.mkdtemp(prefix="celery-leader-screenshots-"))
    say(f"logs in {logs}")
    with RedisServer() as redis_server:
        run = Run(redis_server.url, logs)
        try:
            console = play(run)
            wait_for(
                lambda: STATES <= set(states(console).values()),
                60,
                message=lambda: f"the problems never showed {STATES}: {states(console)}",
            )
            say("states: " + json.dumps(states(console)))
            shoot(console)
        finally:
            run.stop()
    total = sum(p.stat().st_size for p in OUT.glob("console-*.png"))
    say(f"done: {len(VIEWS)} screenshots, {total // 1024} KiB in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
