# celery_user/conftest.py
import pytest

from proj import app

# Celery's in-process worker fixtures (with pytest-celery installed, celery_worker
# would otherwise be its Docker container), and celery-leader's helpers.
pytest_plugins = ("celery.contrib.pytest", "celery_leader.testing")


@pytest.fixture(autouse=True)
def test_settings(leader_url):
    app.conf.update(
        broker_url="memory://",
        # The memory transport polls once a second unless told otherwise.
        broker_transport_options={"polling_interval": 0.01},
        result_backend="cache+memory://",
        leader_url=leader_url,  # a memory:// lease store of this test alone
    )


@pytest.fixture
def celery_app():
    return app  # celery_worker runs our app, not a fresh test app


@pytest.fixture(scope="session")
def celery_worker_pool():
    return "threads"


@pytest.fixture(scope="session")
def celery_worker_parameters():
    return {"perform_ping_check": False}  # our app has no celery.ping task
