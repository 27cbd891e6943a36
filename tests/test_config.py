"""Settings -> LeaderConfig: defaults, Django-style names, and one clear error per bad value."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import socket
import threading

import pytest
from celery import Celery

from celery_leader import ConfigError, LeaderConfig, Lease
from celery_leader.backends import STORES, StoreParams, open_store
from celery_leader.backends.memory import MemoryLock
from celery_leader.backends.urls import mask_url
from celery_leader.dramatiq.settings import load_config
from celery_leader.election.timing import DRIFT, MARGIN
from celery_leader.settings.config import DEFAULT_KEY_PREFIX, DEFAULT_TTL
from celery_leader.settings.table import SETTINGS, TABLE, Setting
from celery_leader.settings.views import (
    ConsoleSettings,
    ElectionSettings,
    LedgerSettings,
    ProbeSettings,
    SchedulerSettings,
)
from harness.servers import free_port
from harness.waiting import wait_for
from tests.docs_text import ROOT, quoted_messages

SECRET = "s3cr3t-Pw"


def config(**values: object) -> LeaderConfig:
    values.setdefault("leader_url", "memory://")
    return LeaderConfig.from_mapping(values)


def assert_one_clear_line(exc: pytest.ExceptionInfo[ConfigError], setting: str) -> str:
    message = str(exc.value)
    assert setting in message, message
    assert "\n" not in message, f"not one line: {message!r}"
    assert SECRET not in message, f"password leaked: {message!r}"
    return message


# -- defaults -------------------------------------------------------------------


def test_defaults() -> None:
    cfg = LeaderConfig.from_mapping({}, broker_url="redis://127.0.0.1:6379/0")
    assert cfg.url == "redis://127.0.0.1:6379/0"
    assert cfg.ttl == DEFAULT_TTL == 15
    assert cfg.renew_interval == pytest.approx(DEFAULT_TTL / 3)
    assert cfg.key_prefix == DEFAULT_KEY_PREFIX == "celery_leader"
    assert (cfg.beat_election, cfg.worker_election) == ("beat", "worker")
    assert cfg.instance_id == f"{socket.gethostname()}:{os.getpid()}"
    assert cfg.fence_tasks is False
    assert cfg.store_kind == "redis"


def test_renew_interval_defaults_to_a_third_of_the_ttl() -> None:
    assert config(leader_ttl=6).renew_interval == pytest.approx(2)


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("redis://127.0.0.1:6379/0", "redis"),
        ("rediss://127.0.0.1:6380/0", "redis"),
        ("unix:///tmp/redis.sock", "redis"),
        ("memory://", "memory"),
        ("file:///{tmp}", "file"),
        ("etcd://127.0.0.1:2379,127.0.0.1:22379", "etcd"),
        ("etcds://u:pw@127.0.0.1?cacert=/ca.pem", "etcd"),
        ("mysql://u:pw@127.0.0.1:3306/db", "mysql"),
        ("mariadb://u:pw@127.0.0.1/db?ssl_ca=/ca.pem", "mysql"),
    ],
)
def test_scheme_selects_the_store(url: str, kind: str, tmp_path) -> None:
    cfg = config(leader_url=url.format(tmp=str(tmp_path).lstrip("/")))
    assert cfg.store_kind == kind
    opened = open_store(cfg)
    try:
        for facet in (opened.lock, opened.records, opened.entries, opened.runs):
            assert type(facet).__module__.startswith(f"celery_leader.backends.{kind}")
    finally:
        opened.close()


@pytest.mark.parametrize("kind", ["postgresql", "postgres"])
def test_postgres_schemes_are_accepted(kind: str) -> None:
    assert config(leader_url=f"{kind}://u:pw@127.0.0.1:5432/db").store_kind == "postgres"


def test_numbers_given_as_strings_are_accepted() -> None:
    """Environment variables arrive as strings."""
    cfg = config(leader_ttl="9", leader_renew_interval="2.5", leader_fence_tasks="true")
    assert (cfg.ttl, cfg.renew_interval, cfg.fence_tasks) == (9.0, 2.5, True)


def test_broker_url_is_the_default_only_when_it_is_redis() -> None:
    broker = f"redis://:{SECRET}@127.0.0.1:6379/3"
    cfg = LeaderConfig.from_mapping({}, broker_url=broker)
    assert cfg.url == broker
    assert SECRET not in cfg.display_url
    assert cfg.display_url == "redis://:***@127.0.0.1:6379/3"


# -- one clear error per bad value ----------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        f"amqp://guest:{SECRET}@127.0.0.1:5672//",
        f"mongodb://u:{SECRET}@db/x",
        "zookeeper://127.0.0.1:2181",
        "127.0.0.1:6379",
    ],
)
def test_unknown_scheme(url: str) -> None:
    with pytest.raises(ConfigError) as exc:
        config(leader_url=url)
    message = assert_one_clear_line(exc, "leader_url")
    assert "scheme" in message
    assert "redis://" in message, "the error should list what is accepted"


@pytest.mark.parametrize(
    ("ttl", "renew"),
    [(5, 5), (5, 6), (1, 30), (0.5, 0.5)],
)
def test_ttl_not_above_renew_interval(ttl: float, renew: float) -> None:
    with pytest.raises(ConfigError) as exc:
        config(leader_ttl=ttl, leader_renew_interval=renew)
    message = assert_one_clear_line(exc, "leader_renew_interval")
    assert "leader_ttl" in message


@pytest.mark.parametrize("setting", ["leader_ttl", "leader_renew_interval"])
@pytest.mark.parametrize("value", [0, -1, -0.5, "0", "-3", math.nan, math.inf, -math.inf])
def test_zero_negative_and_non_finite_numbers(setting: str, value: object) -> None:
    values: dict[str, object] = {"leader_ttl": 30, "leader_renew_interval": 1, setting: value}
    with pytest.raises(ConfigError) as exc:
        config(**values)
    assert_one_clear_line(exc, setting)


@pytest.mark.parametrize("setting", ["leader_ttl", "leader_renew_interval"])
@pytest.mark.parametrize("value", ["abc", "", True, False, [15], {"s": 1}])
def test_numbers_of_the_wrong_type(setting: str, value: object) -> None:
    with pytest.raises(ConfigError) as exc:
        config(**{setting: value})
    assert_one_clear_line(exc, setting)


@pytest.mark.parametrize(
    "setting", ["leader_key_prefix", "leader_beat_election", "leader_worker_election"]
)
@pytest.mark.parametrize("value", ["my app", " lead", "tab\there", "", "{tag}", "a/b", "é", 7])
def test_names_with_spaces_or_odd_characters(setting: str, value: object) -> None:
    with pytest.raises(ConfigError) as exc:
        config(**{setting: value})
    assert_one_clear_line(exc, setting)


@pytest.mark.parametrize("value", ["", "   ", 42])
def test_bad_instance_id(value: object) -> None:
    with pytest.raises(ConfigError) as exc:
        config(leader_instance_id=value)
    assert_one_clear_line(exc, "leader_instance_id")


@pytest.mark.parametrize("value", ["maybe", 2, 1.0])
def test_bad_fence_tasks(value: object) -> None:
    with pytest.raises(ConfigError) as exc:
        config(leader_fence_tasks=value)
    assert_one_clear_line(exc, "leader_fence_tasks")


@pytest.mark.parametrize(
    "broker",
    [
        f"amqp://guest:{SECRET}@127.0.0.1:5672//",
        f"sqs://key:{SECRET}@",
        "memory://",
        None,
    ],
)
def test_no_leader_url_and_broker_is_not_redis(broker: str | None) -> None:
    with pytest.raises(ConfigError) as exc:
        LeaderConfig.from_mapping({}, broker_url=broker)
    assert_one_clear_line(exc, "leader_url is not set")


def test_errors_that_say_what_to_set_name_every_store_and_every_scheme() -> None:
    """The lists in these messages come from the store table, so they cannot drift
    from it (they had left out mysql:// and, on Dramatiq, etcd://)."""
    untold = []
    for call in (
        lambda: LeaderConfig.from_mapping({}, broker_url="amqp://127.0.0.1//"),
        lambda: LeaderConfig.from_env({}),
        lambda: load_config({}),
    ):
        with pytest.raises(ConfigError) as exc:
            call()
        untold += [
            (store.kind, str(exc.value)) for store in STORES if store.hint not in str(exc.value)
        ]
    with pytest.raises(ConfigError) as exc:
        LeaderConfig.from_mapping({"leader_url": "mongodb://db/x"})
    schemes = str(exc.value).partition("use one of ")[2].split(", ")
    assert schemes == [f"{scheme}://" for store in STORES for scheme in store.schemes]
    assert untold == []


@pytest.mark.parametrize("url", ["file://relative/dir", "file:relative", "file://host/dir"])
def test_file_url_must_be_an_absolute_local_directory(url: str) -> None:
    with pytest.raises(ConfigError) as exc:
        open_store(config(leader_url=url))
    assert_one_clear_line(exc, "leader_url")


def test_file_directory_that_cannot_be_created(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError) as exc:
        open_store(config(leader_url=f"file://{blocker}/sub"))
    assert_one_clear_line(exc, "leader_url")


def test_sentinel_url_without_service_name() -> None:
    cfg = config(leader_url=f"redis+sentinel://:{SECRET}@127.0.0.1:26379,127.0.0.2:26379/")
    with pytest.raises(ConfigError) as exc:
        open_store(cfg)
    assert_one_clear_line(exc, "leader_url")


def test_leader_url_of_the_wrong_type() -> None:
    with pytest.raises(ConfigError) as exc:
        config(leader_url=6379)
    assert_one_clear_line(exc, "leader_url")


def test_malformed_redis_port_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as exc:
        open_store(config(leader_url=f"redis://:{SECRET}@127.0.0.1:notaport/0"))
    assert_one_clear_line(exc, "leader_url")


@pytest.mark.parametrize(("ttl", "renew"), [(10, 9.95), (15, 14.9), (1, 0.99)])
def test_renew_interval_the_belief_cannot_outlive_is_refused(ttl: float, renew: float) -> None:
    assert renew >= ttl * (1 - DRIFT) - MARGIN
    with pytest.raises(ConfigError) as exc:
        config(leader_ttl=ttl, leader_renew_interval=renew)
    assert_one_clear_line(exc, "leader_renew_interval")


def test_lease_checks_its_own_arguments() -> None:
    backend = MemoryLock(StoreParams("memory://args", "p", 0.1))
    for ttl, renew in [(1, 1), (1, 2), (0, 0.5), (-1, 0.5), (1, 0), (1, -0.1)]:
        with pytest.raises(ConfigError, match="renew_interval"):
            Lease("e", backend, ttl=ttl, renew_interval=renew, instance_id="x")
    for election in ["", "two words", "{x}", None]:
        with pytest.raises(ConfigError, match="election"):
            Lease(election, backend, ttl=1, renew_interval=0.3, instance_id="x")  # type: ignore[arg-type]


# -- Django-style names ----------------------------------------------------------


class DjangoSettings:
    CELERY_BROKER_URL = f"amqp://guest:{SECRET}@127.0.0.1:5672//"
    CELERY_LEADER_URL = f"redis://:{SECRET}@127.0.0.1:6379/2"
    CELERY_LEADER_TTL = 9
    CELERY_LEADER_RENEW_INTERVAL = 2
    CELERY_LEADER_KEY_PREFIX = "myproj"
    CELERY_LEADER_BEAT_ELECTION = "beat-eu"
    CELERY_LEADER_WORKER_ELECTION = "reports"
    CELERY_LEADER_INSTANCE_ID = "web-1"
    CELERY_LEADER_FENCE_TASKS = True
    # Not in the namespace: must not be picked up.
    LEADER_TTL = 99


def app_from(settings: type) -> Celery:
    app = Celery("django_style", set_as_current=False)
    app.config_from_object(settings, namespace="CELERY")
    return app


def test_django_style_names_through_config_from_object() -> None:
    cfg = LeaderConfig.from_app(app_from(DjangoSettings))
    assert cfg == LeaderConfig(
        url=DjangoSettings.CELERY_LEADER_URL,
        ttl=9.0,
        renew_interval=2.0,
        key_prefix="myproj",
        beat_election="beat-eu",
        worker_election="reports",
        instance_id="web-1",
        fence_tasks=True,
        deployment="amqp://127.0.0.1:5672//",
    )
    assert SECRET not in repr(cfg.display_url)


def test_django_style_bad_value_names_the_setting() -> None:
    class Bad(DjangoSettings):
        CELERY_LEADER_TTL = 0

    with pytest.raises(ConfigError) as exc:
        LeaderConfig.from_app(app_from(Bad))
    # Named as the Django user wrote it.
    assert_one_clear_line(exc, "CELERY_LEADER_TTL must be")


def test_django_style_without_leader_url_and_a_non_redis_broker() -> None:
    class NoUrl:
        CELERY_BROKER_URL = f"amqp://guest:{SECRET}@127.0.0.1:5672//"

    with pytest.raises(ConfigError) as exc:
        LeaderConfig.from_app(app_from(NoUrl))
    assert_one_clear_line(exc, "CELERY_LEADER_URL is not set")


def test_django_style_redis_broker_is_the_default() -> None:
    class RedisBroker:
        CELERY_BROKER_URL = "redis://127.0.0.1:6379/5"

    assert LeaderConfig.from_app(app_from(RedisBroker)).url == "redis://127.0.0.1:6379/5"


def test_plain_app_conf() -> None:
    app = Celery("plain", set_as_current=False, broker="amqp://")
    app.conf.leader_url = "memory://"
    app.conf.leader_ttl = 4
    cfg = LeaderConfig.from_app(app)
    assert (cfg.url, cfg.ttl, cfg.renew_interval) == ("memory://", 4.0, pytest.approx(4 / 3))


# -- passwords -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        (f"redis://:{SECRET}@h:6379/0", "redis://:***@h:6379/0"),
        (f"redis://user:{SECRET}@h:6379/0", "redis://user:***@h:6379/0"),
        (
            f"rediss://:{SECRET}@h:6380/0?ssl_cert_reqs=none",
            "rediss://:***@h:6380/0?ssl_cert_reqs=none",
        ),
        (
            f"redis+sentinel://:{SECRET}@h1:26379,h2:26379/mymaster/0",
            "redis+sentinel://:***@h1:26379,h2:26379/mymaster/0",
        ),
        (f"postgresql://leader:{SECRET}@db:5432/app", "postgresql://leader:***@db:5432/app"),
        (
            f"etcds://leader:{SECRET}@h1:2379,h2:2379?cacert=/ca.pem",
            "etcds://leader:***@h1:2379,h2:2379?cacert=/ca.pem",
        ),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("memory://", "memory://"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_mask_url_hides_a_password_containing_at_sign() -> None:
    import redis

    url = "redis://:p@ss-w0rd@127.0.0.1:6379/0"
    assert redis.Redis.from_url(url).connection_pool.connection_kwargs["password"] == "p@ss-w0rd"
    assert "ss-w0rd" not in mask_url(url)


def test_unreachable_store_at_start_logs_masked_url_and_keeps_trying(caplog) -> None:
    """Starting with the store down is not an error: the lease logs once and retries.

    (That it then leads once the store is there: test_lease_redis.py.)
    """
    port = free_port()
    url = f"redis://:{SECRET}@127.0.0.1:{port}/0"
    cfg = config(leader_url=url, leader_ttl=1, leader_renew_interval=0.3)
    caplog.set_level(logging.INFO, logger="celery_leader")

    store = open_store(cfg)
    tries: list[object] = []
    acquire = store.lock.acquire

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        tries.append(args)
        return acquire(*args, **kwargs)

    store.lock.acquire = counting  # type: ignore[method-assign]
    lease = Lease.from_config("start-down", cfg, store.lock)
    lease.start()
    try:
        wait_for(lambda: len(tries) >= 4, timeout=5, message="the lease stopped retrying")
        thread = next(t for t in threading.enumerate() if t.name == "celery-leader:start-down")
        assert thread.is_alive()
        assert not lease.is_leader()
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, "one warning for the outage, not one per retry"
        assert "unreachable" in warnings[0].getMessage()
        assert f"127.0.0.1:{port}" in caplog.text
        assert ":***@" in caplog.text
        assert SECRET not in caplog.text
    finally:
        lease.stop()
        store.close()


def test_from_env_reads_celery_leader_variables() -> None:
    config = LeaderConfig.from_env(
        {
            "CELERY_LEADER_URL": "memory://",
            "CELERY_LEADER_TTL": "4",
            "CELERY_LEADER_KEY_PREFIX": "p",
        }
    )
    assert (config.url, config.ttl, config.key_prefix) == ("memory://", 4.0, "p")
    assert config.renew_interval == pytest.approx(4 / 3)


def test_from_env_overrides_win_and_errors_name_the_variable() -> None:
    env = {"CELERY_LEADER_URL": "memory://", "CELERY_LEADER_TTL": "x"}
    assert LeaderConfig.from_env(env, leader_ttl=6).ttl == 6
    with pytest.raises(ConfigError, match=r"^CELERY_LEADER_TTL must be a number"):
        LeaderConfig.from_env(env)
    with pytest.raises(ConfigError, match=r"^leader_ttl must be a number of seconds greater"):
        LeaderConfig.from_env({"CELERY_LEADER_URL": "memory://"}, leader_ttl=-1)
    with pytest.raises(ConfigError, match=r"^CELERY_LEADER_URL is not set"):
        LeaderConfig.from_env({})


def test_unknown_settings_are_warned_about_once_with_the_closest_name(caplog) -> None:
    class Misspelt(DjangoSettings):
        CELERY_LEADER_RENEW_INTERVALL = 2
        CELERY_LEADER_ZZZ = 1
        # What a worker hands its pool processes: inherited, never warned about.
        CELERY_LEADER_TABLE = "/tmp/t"
        CELERY_LEADER_COUNTERS = "/tmp/c"

    app = app_from(Misspelt)
    with caplog.at_level(logging.WARNING, logger="celery_leader.settings"):
        LeaderConfig.from_app(app)
        LeaderConfig.from_app(app)
    assert [r.getMessage() for r in caplog.records] == [
        "celery-leader: unknown setting CELERY_LEADER_RENEW_INTERVALL is ignored; "
        "did you mean CELERY_LEADER_RENEW_INTERVAL?",
        "celery-leader: unknown setting CELERY_LEADER_ZZZ is ignored",
    ]


def test_configuration_docs_quote_the_real_messages() -> None:
    """Every error line docs/configuration.md quotes is what the code says.

    The store-building errors and warnings it quotes come from real processes
    (tests/test_startup_errors.py checks those).
    """

    class Django:
        CELERY_LEADER_URL = "memory://"
        CELERY_LEADER_TTL = 0

    cases = [
        {"leader_url": "memory://", "leader_renew_interval": 20},
        {"leader_url": "mongodb://u:pw@db/x"},
        {"leader_url": "memory://", "leader_key_prefix": "my prefix"},
        {"leader_url": "memory://", "leader_replica_acks": -1},
        {"broker_url": "amqp://guest:pw@rabbit//"},
        {"leader_url": "memory://", "leader_ttl": 1e12},
        {"leader_url": "memory://", "leader_ttl": 0.01},
    ]
    real = set()
    for values in cases:
        broker = values.pop("broker_url", None)
        with pytest.raises(ConfigError) as exc:
            LeaderConfig.from_mapping(values, broker_url=broker)
        real.add(f"Error: {exc.value}")
    with pytest.raises(ConfigError) as exc:
        LeaderConfig.from_app(app_from(Django))
    real.add(f"Error: {exc.value}")
    from_processes = {
        line
        for line in quoted_messages()
        if "cannot create the directory" in line
        or "ENGINE 'django.db.backends.sqlite3'" in line
        or "unknown setting" in line
    }
    assert quoted_messages() - from_processes == real


@pytest.mark.parametrize("value", ["Store", "utc", "ntp", 1, True])
def test_leader_clock_is_store_or_local(value: object) -> None:
    assert (config().clock, config().max_clock_skew) == ("store", 5.0)
    assert config(leader_clock="local").clock == "local"
    with pytest.raises(ConfigError) as exc:
        config(leader_clock=value)
    assert "store, local" in assert_one_clear_line(exc, "leader_clock")


@pytest.mark.parametrize("value", [0, -2, "abc", math.nan, True])
def test_leader_max_clock_skew_is_seconds_above_zero(value: object) -> None:
    assert config(leader_max_clock_skew="2.5").max_clock_skew == 2.5
    with pytest.raises(ConfigError) as exc:
        config(leader_max_clock_skew=value)
    assert_one_clear_line(exc, "leader_max_clock_skew")


def test_clock_settings_from_the_environment_name_the_variable() -> None:
    env = {"CELERY_LEADER_URL": "memory://", "CELERY_LEADER_CLOCK": "local"}
    assert LeaderConfig.from_env(env).clock == "local"
    with pytest.raises(ConfigError) as exc:
        LeaderConfig.from_env({**env, "CELERY_LEADER_MAX_CLOCK_SKEW": "-1"})
    assert_one_clear_line(exc, "CELERY_LEADER_MAX_CLOCK_SKEW")


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("leader_ledger_keep", 10**400),
        ("leader_ledger_resend_after", 10**400),
        ("leader_health_port", 10**400),
        ("leader_replica_acks", "1e999"),
    ],
)
def test_numbers_too_large_for_a_float_are_one_clear_line(setting: str, value: object) -> None:
    with pytest.raises(ConfigError) as exc:
        config(**{setting: value})
    assert_one_clear_line(exc, setting)


# -- the table of settings ---------------------------------------------------------


def test_each_field_is_a_row_of_the_table_and_defaults_to_the_rows_default() -> None:
    fields = {field.name: field for field in dataclasses.fields(LeaderConfig)}
    assert sorted(fields) == sorted([row.field for row in TABLE] + ["deployment"])
    assert SETTINGS == tuple(f"leader_{row.field}" for row in TABLE)
    nothing_set = LeaderConfig.from_mapping({"leader_url": "memory://"})
    defaults = {
        name: field.default
        for name, field in fields.items()
        if field.default is not dataclasses.MISSING
    }
    assert {name: getattr(nothing_set, name) for name in defaults} == defaults


def test_each_consumer_reads_a_frozen_view_of_its_settings() -> None:
    cfg = config(leader_ttl=6, leader_health_port="9000", leader_overlap="skip")
    assert cfg.election == ElectionSettings(
        url="memory://",
        ttl=6,
        renew_interval=2,
        key_prefix="celery_leader",
        instance_id=cfg.instance_id,
    )
    assert (cfg.scheduler.beat_election, cfg.scheduler.missed_slots) == ("beat", "once")
    assert (cfg.run_ledger.ledger, cfg.run_ledger.overlap) == (True, "skip")
    assert cfg.probes == ProbeSettings(health_port=9000)
    assert not hasattr(cfg.election, "overlap")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.election.ttl = 1  # type: ignore[misc]
    views = (ElectionSettings, SchedulerSettings, LedgerSettings, ProbeSettings, ConsoleSettings)
    in_views = {field.name for view in views for field in dataclasses.fields(view)}
    assert {field.name for field in dataclasses.fields(LeaderConfig)} - in_views == {
        "worker_election",
        "fence_tasks",
    }


def _settings_tables(page: str) -> dict[str, str]:
    """Setting -> its default cell in the ``| setting | default | meaning |`` tables of ``page``."""
    rows = {}
    for table in (ROOT / page).read_text().split("| setting | default | meaning |")[1:]:
        for line in table.split("\n\n")[0].splitlines()[2:]:
            name, default = line.split(" | ")[:2]
            rows[name.strip("|` ")] = default
    return rows


def _as_documented(row: Setting) -> str:
    """A row's default as the docs' settings tables write it."""
    if row.shown:
        return f"`{row.shown}`"
    if row.default is None:
        return "not set"
    if isinstance(row.default, str):
        return f'`"{row.default}"`'
    if isinstance(row.default, tuple):
        return f"`{json.dumps(list(row.default))}`"
    if isinstance(row.default, bool):
        return f"`{row.default}`"
    return f"`{row.default:g}`"


def test_the_docs_settings_tables_follow_the_table_of_settings() -> None:
    """docs/configuration.md lists every setting, and only settings; every page's
    settings table gives each one the table's default."""
    assert sorted(_settings_tables("docs/configuration.md")) == sorted(SETTINGS)
    rows = {row.name: row for row in TABLE}
    pages = sorted(str(page.relative_to(ROOT)) for page in (ROOT / "docs").rglob("*.md"))
    documented = [
        (page, name, cell) for page in pages for name, cell in _settings_tables(page).items()
    ]
    assert len(documented) > len(SETTINGS), "the tables of other pages were not found"
    assert [
        (page, name, cell, _as_documented(rows[name]))
        for page, name, cell in documented
        if name not in rows or not cell.startswith(_as_documented(rows[name]))
    ] == []


def test_the_docs_name_every_scheme_of_every_store_for_leader_url() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    cell = next(line for line in text.splitlines() if line.startswith("| `leader_url` |"))
    assert [s for store in STORES for s in store.schemes if f"`{s}://" not in cell] == []
