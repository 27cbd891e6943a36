# celery_user/test_beat.py
import time
from collections import Counter

from celery_leader.testing import beat_replicas


def test_three_beats_send_each_slot_once(tmp_path):
    every_200_ms = {"refresh-prices": {"task": "proj.refresh_prices", "schedule": 0.2}}
    with beat_replicas(
        "proj",
        3,
        leader_url=f"file://{tmp_path}/leases",
        workdir=tmp_path,
        settings={"beat_schedule": every_200_ms},
    ) as beats:
        time.sleep(2)
    sent = beats.sent()  # {"beat-1": [], "beat-2": ["refresh-prices@2026-...", ...], ...}
    slots = [slot for by_replica in sent.values() for slot in by_replica]
    assert slots
    assert max(Counter(slots).values()) == 1  # no slot sent twice
    assert len([name for name, by_replica in sent.items() if by_replica]) == 1  # one leader
