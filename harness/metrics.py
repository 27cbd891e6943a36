"""Read a Prometheus endpoint the way a scraper does."""

from __future__ import annotations

import urllib.request


def scrape(port: int) -> dict[str, float]:
    """Samples of the endpoint on 127.0.0.1:``port``: ``'name{labels}' -> value``;
    empty while nothing serves it (so a deadline wait can poll it)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            lines = response.read().decode().splitlines()
    except OSError:
        return {}
    return {
        name: float(value)
        for name, _, value in (line.rpartition(" ") for line in lines)
        if name and not name.startswith("#")
    }
