"""The example project's Celery app: every setting comes from Django's settings."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
# CELERY_LEADER_URL, CELERY_LEADER_TTL, ... arrive here as leader_url, leader_ttl.
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
