# celery_user/test_eager.py
import pytest
from celery_leader import NotLeader, current_epoch, ensure_leader, is_leader
from celery_leader.testing import as_follower, as_leader

from proj import app, refresh_prices, send_digest


@pytest.fixture(autouse=True)
def eager():
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


@pytest.mark.leader(epoch=7)
def test_the_leader_runs_the_body():
    assert refresh_prices.delay().get() == "refreshed under epoch 7"
    assert send_digest.delay().get() == "sent"
    assert is_leader() and current_epoch() == 7


@pytest.mark.follower
def test_a_follower_does_not():
    assert refresh_prices.delay().get() is None  # the body did not run
    assert send_digest.delay().get() is None
    assert not is_leader() and current_epoch() is None
    with pytest.raises(NotLeader):
        ensure_leader()


def test_leadership_changes_within_a_test():
    with as_leader() as epoch:
        assert refresh_prices.delay().get() == f"refreshed under epoch {epoch}"
        with as_follower("reports"):  # still leads "worker", not "reports"
            assert send_digest.delay().get() is None
            assert refresh_prices.delay().get() is not None
    with as_follower():
        assert refresh_prices.delay().get() is None
