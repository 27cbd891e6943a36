# dramatiq_user/test_actors.py
import time

import pytest
from celery_leader.dramatiq import current_epoch, is_leader
from celery_leader.testing import as_leader

import app


@pytest.mark.leader(epoch=5)
def test_the_leader_runs_both(stub_broker, stub_worker):
    app.refresh_prices.send()
    app.rebuild_index.send()
    stub_broker.join("prices")
    stub_broker.join("index")
    stub_worker.join()
    assert app.refreshed == [5]
    assert app.rebuilt == [5]
    assert is_leader() and current_epoch() == 5


@pytest.mark.follower
def test_a_follower_skips(stub_broker, stub_worker):
    app.refresh_prices.send()
    stub_broker.join("prices")
    stub_worker.join()
    assert app.refreshed == []
    assert not is_leader()


@pytest.mark.follower
def test_a_follower_leaves_wait_actors_to_the_leader(stub_broker, stub_worker):
    app.rebuild_index.send()
    time.sleep(0.3)
    assert app.rebuilt == []  # still queued: a follower does not consume "index"
    with as_leader(epoch=6):
        stub_broker.join("index")
        stub_worker.join()
    assert app.rebuilt == [6]
