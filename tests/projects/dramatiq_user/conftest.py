# dramatiq_user/conftest.py
import os

# Before the app is imported: a StubBroker, an in-memory lease store, and paused
# consumers that pick up again within 0.1 s of a resume (Dramatiq's default: 3 s).
os.environ.update(UNIT_TESTS="1", CELERY_LEADER_URL="memory://", dramatiq_restart_delay="100")

import pytest
from dramatiq import Worker

import app

pytest_plugins = ("celery_leader.testing",)


@pytest.fixture
def stub_broker():
    app.broker.flush_all()
    app.refreshed.clear()
    app.rebuilt.clear()
    return app.broker


@pytest.fixture
def stub_worker(stub_broker):
    worker = Worker(stub_broker, worker_timeout=100)
    worker.start()
    yield worker
    worker.stop()
