"""Django settings for dramatiq-crontab: its Redis lock with the benchmark's ttl.

BROKER_URL, LOCK_URL and TTL come from the environment. Standbys wait for the
lock as long as the benchmark runs (LOCK_BLOCKING_TIMEOUT) instead of exiting.
"""

import os

SECRET_KEY = "benchmark"
INSTALLED_APPS = ["dramatiq_crontab", "benchmarks.apps.crontab_bench"]
USE_TZ = True
TIME_ZONE = "UTC"
DRAMATIQ_CRONTAB = {
    "REDIS_URL": os.environ["LOCK_URL"],
    "LOCK_TIMEOUT": float(os.environ.get("TTL", "3")),
    "LOCK_REFRESH_INTERVAL": float(os.environ.get("TTL", "3")) / 3,
    "LOCK_BLOCKING_TIMEOUT": 3600,
}
