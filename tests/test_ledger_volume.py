"""``leader status`` over a large run ledger never blocks the Redis it shares.

It once read every record in one Lua script: past a few hundred thousand
records Redis answered ``BUSY`` to every client meanwhile, and every lease in
that Redis failed to renew.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import redis

from celery_leader.backends import RunWrite, open_store
from celery_leader.cli import commands as ops
from celery_leader.ledger import RunRecord
from celery_leader.settings.config import LeaderConfig

RECORDS = 40_000
ENTRIES = 20
#: No command of the status read may run this long (µs). A page of the read is
#: a few hundred small reads, well under a millisecond; 20 ms leaves room for a
#: loaded machine, and the whole-ledger script took hundreds of ms at 40,000.
SLOW_US = 20_000


def test_leader_status_runs_no_long_command_over_a_large_ledger(redis_url: str) -> None:
    config = LeaderConfig.from_mapping({"leader_url": redis_url})
    now = time.time()

    def write(worker: int) -> None:
        store = open_store(config)
        for i in range(worker, RECORDS, 4):
            slot = f"job-{i % ENTRIES}@{i:08d}"
            record = RunRecord.sent_by(slot, "b", 1, now).dump()
            store.runs.put("beat", RunWrite(slot, None, record, 3600))
        store.close()

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(write, range(4)))
    client = redis.Redis.from_url(redis_url)
    client.config_set("slowlog-log-slower-than", SLOW_US)
    client.slowlog_reset()
    lines: list[str] = []
    ops.status(config, lines.append)
    assert len([line for line in lines if line.startswith("job-")]) == ENTRIES, lines
    slow = [(entry["duration"], entry["command"][:80]) for entry in client.slowlog_get(10)]
    assert slow == [], f"commands over {SLOW_US} µs during leader status: {slow}"
