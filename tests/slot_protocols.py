"""The slot protocol on its own, for unit tests: a fresh in-process memory store
per test, and replicas that lead within milliseconds.

A test module takes the fixtures by name (``config = slot_protocols.config``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime

import pytest

from celery_leader.schedule import protocol
from celery_leader.schedule.jobs import Adapter
from celery_leader.settings.config import LeaderConfig
from harness.waiting import wait_for


@pytest.fixture
def config() -> LeaderConfig:
    """A fresh memory store; a 0.6 s lease renewed every 0.1 s, so a replica leads
    at once; a 60 s tick watchdog, which a test's stepped clock never trips."""
    return LeaderConfig.from_env(
        {},
        leader_url=f"memory://{uuid.uuid4().hex}",
        leader_ttl=0.6,
        leader_renew_interval=0.1,
        leader_tick_timeout=60,
    )


@pytest.fixture
def made() -> Iterator[list[protocol.SlotProtocol]]:
    """The replicas a test made with :func:`leading`, closed after it."""
    made: list[protocol.SlotProtocol] = []
    yield made
    for slot_protocol in made:
        slot_protocol.close()


def leading(
    config: LeaderConfig,
    adapter: Adapter,
    made: list[protocol.SlotProtocol],
    clock: Callable[[], datetime] | None = None,
    max_sleep: float = 60.0,
) -> protocol.SlotProtocol:
    """A replica of ``adapter``'s schedule, once it leads (it is alone on its store)."""
    slot_protocol = protocol.SlotProtocol(
        config,
        adapter,
        logging.getLogger("tests.slot_protocols"),
        idle=0.01,
        max_sleep=max_sleep,
        clock=clock,
    )
    made.append(slot_protocol)
    wait_for(slot_protocol.lease.is_leader, 3.0, message="never led")
    return slot_protocol
