"""Settings of the celery-leader example project.

URLs come from the environment and default to the embedded stores, so the
project runs with no server at all: Celery's filesystem transport as broker and
a ``file://`` lease store, both under ``DEMO_DATA`` (default ``.data/``).
"""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("DEMO_DATA", BASE_DIR / ".data"))
BROKER_DIR = DATA / "broker"
BROKER_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_celery_beat",
    "celery_leader.contrib.django_console",  # the console's permissions
    "ticker",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "proj.urls"
# The console at /leader/ sends visitors who are not logged in to the admin's login.
LOGIN_URL = "admin:login"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DJANGO_DB", str(DATA / "db.sqlite3")),
    }
}
# DJANGO_MYSQL=user:password@host:port/name runs the project on MySQL or MariaDB,
# whose database can then be the lease store too: CELERY_LEADER_URL=django://default.
if os.environ.get("DJANGO_MYSQL"):
    from urllib.parse import urlsplit

    import pymysql

    # Django's MySQL backend imports mysqlclient (MySQLdb); PyMySQL, which
    # celery-leader[mysql] installs, stands in for it.
    pymysql.install_as_MySQLdb()
    _db = urlsplit(f"mysql://{os.environ['DJANGO_MYSQL']}")
    DATABASES["default"] = {
        "ENGINE": "django.db.backends.mysql",
        "NAME": _db.path.lstrip("/"),
        "USER": _db.username,
        "PASSWORD": _db.password,
        "HOST": _db.hostname,
        "PORT": _db.port,
        # django-celery-beat asks the database whether the schedule changed on
        # every beat tick, after closing "old" connections: with Django's
        # default CONN_MAX_AGE = 0 that is a new connection per tick, and a new
        # leader's first ticks wait for several. Keep it, checked before reuse.
        "CONN_MAX_AGE": None,
        "CONN_HEALTH_CHECKS": True,
    }
# DJANGO_POSTGRES=user:password@host:port/name runs it on PostgreSQL (psycopg 3).
if os.environ.get("DJANGO_POSTGRES"):
    from urllib.parse import urlsplit

    _pg = urlsplit(f"postgresql://{os.environ['DJANGO_POSTGRES']}")
    DATABASES["default"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _pg.path.lstrip("/"),
        "USER": _pg.username,
        "PASSWORD": _pg.password,
        "HOST": _pg.hostname,
        "PORT": _pg.port,
    }
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Celery (namespace CELERY_) ---------------------------------------------
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's filesystem transport with atomic writes: with kombu's own, a busy
    # worker can read a half-written message and stop (see proj/broker.py).
    CELERY_BROKER_TRANSPORT = "proj.broker:Transport"
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # Used by the filesystem transport only: producers and the worker share
    # one folder; a short polling interval keeps the demo's timeline live.
    "data_folder_in": str(BROKER_DIR),
    "data_folder_out": str(BROKER_DIR),
    # Without this the transport writes its control exchanges to ./control.
    "control_folder": str(BROKER_DIR / "control"),
    "polling_interval": 0.1,
}
CELERY_LEADER_URL = os.environ.get("CELERY_LEADER_URL", f"file://{DATA / 'leader'}")
CELERY_LEADER_TTL = float(os.environ.get("CELERY_LEADER_TTL", "15"))
CELERY_LEADER_INSTANCE_ID = os.environ.get("CELERY_LEADER_INSTANCE_ID")  # None: host:pid
CELERY_LEADER_MISSED_SLOTS = os.environ.get("CELERY_LEADER_MISSED_SLOTS", "once")
# The console at /leader/ is read-only unless this is on; then staff with the
# permission celery_leader.change_console may pause, resume and run entries.
CELERY_LEADER_CONSOLE_WRITE = os.environ.get("CELERY_LEADER_CONSOLE_WRITE") == "1"
CELERY_BEAT_SCHEDULER = "celery_leader.contrib.django:LeaderDatabaseScheduler"
CELERY_BEAT_SCHEDULE = {
    "heartbeat": {
        "task": "ticker.tasks.heartbeat",
        "schedule": float(os.environ.get("DEMO_EVERY", "1.0")),
    },
}
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
