"""Reading celery-redbeat's stored entries (``entries import --from-redbeat``): JSON only,
never a pickle.
"""

from __future__ import annotations

from typing import Any

import redis

from ...exceptions import StoreUnavailable
from ..urls import mask_url


def read_redbeat(url: str, prefix: str, timeout: float) -> tuple[set[str], list[tuple[str, str]]]:
    """The names of redbeat's static entries, and ``(name, definition JSON)`` of every entry."""
    key_prefix = prefix if prefix.endswith(":") else f"{prefix}:"
    client: Any = redis.Redis.from_url(url, decode_responses=True, socket_timeout=timeout)
    try:
        statics = set(client.smembers(f"{key_prefix}:statics"))
        keys = client.zrange(f"{key_prefix}:schedule", 0, -1)
        found = []
        for key in keys:
            text = client.hget(key, "definition")
            if text is not None:
                found.append((key[len(key_prefix) :], text))
        return statics, found
    except redis.RedisError as exc:
        raise StoreUnavailable(f"redbeat's Redis {mask_url(url)}: {exc}") from exc
    finally:
        client.close()
