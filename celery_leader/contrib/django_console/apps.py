"""The Django app ``celery_leader.contrib.django_console``: the console's permissions."""

from __future__ import annotations

from django.apps import AppConfig  # type: ignore[import-untyped, unused-ignore]


class LeaderConfig(AppConfig):  # type: ignore[misc, unused-ignore]
    """The app's label is ``celery_leader``: its permissions are
    ``celery_leader.view_console`` and ``celery_leader.change_console``."""

    name = "celery_leader.contrib.django_console"
    label = "celery_leader"
    verbose_name = "celery-leader"
    default_auto_field = "django.db.models.BigAutoField"
