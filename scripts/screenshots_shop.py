"""The shop that ``scripts/screenshots.py`` runs for the console's screenshots.

A Celery app of a small online shop: every setting comes from environment variables
the script sets (BROKER_URL, LEADER_URL, LEADER_TTL, INSTANCE_ID). Its tasks take
realistic times, and one of them always fails, so that each of the console's views
has something to show. The store entries are added by the script; the two code
entries below are the ``beat_schedule`` a shop would keep in code.
"""

from __future__ import annotations

import os
import random
import time

from celery import Celery

app = Celery("shop", broker=os.environ["BROKER_URL"])
app.conf.leader_url = os.environ["LEADER_URL"]
app.conf.leader_ttl = float(os.environ.get("LEADER_TTL", "3"))
app.conf.leader_instance_id = os.environ.get("INSTANCE_ID")
# The console's settings (``CELERY_LEADER_CONSOLE_WRITE``, ...) as ``leader_*`` ones.
for _name, _value in os.environ.items():
    if _name.startswith("CELERY_LEADER_"):
        app.conf[_name.removeprefix("CELERY_").lower()] = _value
app.conf.beat_schedule = {
    "expire-carts": {"task": "shop.expire_carts", "schedule": 30.0},
    "heartbeat": {
        "task": "shop.heartbeat",
        "schedule": 10.0,
        "options": {"late_after": 5},
    },
}


def _work(low: float, high: float) -> None:
    """Stands for the task's real work: a while between ``low`` and ``high`` seconds."""
    time.sleep(random.uniform(low, high))


@app.task(name="shop.heartbeat")  # type: ignore[untyped-decorator]
def heartbeat() -> None:
    """Proves the schedule runs."""


@app.task(name="shop.expire_carts")  # type: ignore[untyped-decorator]
def expire_carts() -> None:
    """Empties the carts nobody touched for a day."""
    _work(0.05, 0.2)


@app.task(name="shop.refresh_prices")  # type: ignore[untyped-decorator]
def refresh_prices(currency: str = "EUR") -> None:
    """Reads the exchange rates and reprices the catalogue."""
    _work(0.1, 0.6)


@app.task(name="shop.sync_inventory")  # type: ignore[untyped-decorator]
def sync_inventory(warehouse: str) -> None:
    """Copies a warehouse's stock levels into the shop."""
    _work(0.4, 2.0)


@app.task(name="shop.send_invoices")  # type: ignore[untyped-decorator]
def send_invoices() -> None:
    """Mails the invoices of the orders shipped since the last run."""
    _work(0.2, 0.8)


@app.task(name="shop.import_supplier_feed")  # type: ignore[untyped-decorator]
def import_supplier_feed(supplier: str) -> None:
    """Reads a supplier's product feed: the supplier's server never answers."""
    _work(0.5, 1.0)
    raise ConnectionError(f"{supplier}: feed server timed out after 30 s")


@app.task(name="shop.rebuild_search_index")  # type: ignore[untyped-decorator]
def rebuild_search_index() -> None:
    """Rebuilds the product search index: longer than its entry allows."""
    _work(90.0, 100.0)


@app.task(name="shop.export_orders")  # type: ignore[untyped-decorator]
def export_orders() -> None:
    """Copies the day's orders to the warehouse; its queue has no worker yet."""


@app.task(name="shop.quarterly_report")  # type: ignore[untyped-decorator]
def quarterly_report() -> None:
    """The finance team's report."""
