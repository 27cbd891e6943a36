"""``django://ALIAS`` read from Django's DATABASES, without a database: the store the
alias's ENGINE selects, its client's parameters, and the one-line errors. The
stores themselves, opened this way, are tested in the PostgreSQL and MySQL store
tests."""

from __future__ import annotations

import pytest

from celery_leader.backends import open_store
from celery_leader.contrib.django_db import DjangoDatabase, django_database
from celery_leader.exceptions import ConfigError
from celery_leader.settings.config import LeaderConfig

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "app",
        "USER": "u",
        "PASSWORD": "pw",
        "HOST": "db",
        "PORT": 5433,
        "OPTIONS": {"sslmode": "require", "server_side_binding": True, "pool": True},
    },
    "gis": {"ENGINE": "django.contrib.gis.db.backends.postgis", "NAME": "geo"},
    "my": {
        "ENGINE": "django.db.backends.mysql",
        "NAME": "app",
        "USER": "u",
        "PASSWORD": "pw",
        "HOST": "/run/mysqld/mysqld.sock",
        "PORT": "3307",
        "OPTIONS": {"ssl": {"ca": "/ca.pem", "mode": "x"}, "charset": "utf8mb4"},
    },
    "nameless": {"ENGINE": "django.db.backends.mysql"},
    "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}


@pytest.fixture(autouse=True)
def django_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.conf import LazySettings

    settings = LazySettings()
    settings.configure(DATABASES=DATABASES)
    monkeypatch.setattr("django.conf.settings", settings)


def test_the_engine_selects_the_store_and_the_entry_its_parameters() -> None:
    assert django_database("django://default") == DjangoDatabase(
        "postgresql",
        {"sslmode": "require", "dbname": "app", "user": "u", "password": "pw", "host": "db",
         "port": "5433"},
    )  # fmt: skip
    assert django_database("django://gis") == DjangoDatabase("postgresql", {"dbname": "geo"})
    assert django_database("django://my") == DjangoDatabase(
        "mysql",
        {"database": "app", "user": "u", "password": "pw", "port": 3307,
         "unix_socket": "/run/mysqld/mysqld.sock", "ssl_ca": "/ca.pem"},
    )  # fmt: skip
    assert django_database("django://") == django_database("django:///default")


@pytest.mark.parametrize(
    ("alias", "kind", "target"),
    [
        ("default", "postgres", "django://default (database 'app' on db)"),
        ("my", "mysql", "django://my (database 'app' on /run/mysqld/mysqld.sock)"),
    ],
)
def test_the_settings_hand_the_store_its_parameters(alias: str, kind: str, target: str) -> None:
    config = LeaderConfig.from_mapping({"leader_url": f"django://{alias}"})
    assert config.store_kind == kind
    store = open_store(config)
    try:
        assert store.params.connection == django_database(config.url).connection
        assert store.lock._db.target == target and "pw" not in target
    finally:
        store.close()


@pytest.mark.parametrize(
    ("alias", "needle"),
    [
        ("lite", "DATABASES['lite'] uses ENGINE 'django.db.backends.sqlite3'; celery-leader "
                 "needs PostgreSQL (django.db.backends.postgresql)"),
        ("nope", "settings.DATABASES has no 'nope' (it has 'default', 'gis', 'my', "),
        ("nameless", "DATABASES['nameless'] has no NAME"),
    ],
)  # fmt: skip
def test_an_unusable_alias_fails_in_one_line(alias: str, needle: str) -> None:
    config = LeaderConfig.from_mapping({"leader_url": f"django://{alias}"})
    with pytest.raises(ConfigError) as exc:
        open_store(config)
    message = str(exc.value)
    assert message.startswith(f"leader_url 'django://{alias}': ") and "\n" not in message
    assert needle in message
