# celery_user/test_worker.py
import time

import pytest
from celery_leader.testing import as_leader

from proj import refresh_prices, send_digest


@pytest.mark.leader(epoch=3)
def test_the_leading_worker_runs_it(celery_worker):
    assert refresh_prices.delay().get(timeout=10) == "refreshed under epoch 3"
    assert send_digest.delay().get(timeout=10) == "sent"


@pytest.mark.follower
def test_a_following_worker_leaves_it_to_the_leader(celery_worker):
    result = refresh_prices.delay()  # goes to the leader queue; followers do not consume it
    time.sleep(0.5)
    assert result.state == "PENDING"
    with as_leader(epoch=4):  # elected: the worker consumes the leader queue
        assert result.get(timeout=10) == "refreshed under epoch 4"
