"""celery-leader in a Django project: ``celery_leader.contrib.django:LeaderDatabaseScheduler``
is the path users type for the scheduler (it lives in :mod:`celery_leader.celery.django`),
and ``celery_leader.contrib.django.urls`` mounts the console behind Django's users,
permissions and CSRF (its permissions come with the app
``celery_leader.contrib.django_console``)."""

from __future__ import annotations

from ...celery.django import LeaderDatabaseScheduler

__all__ = ["LeaderDatabaseScheduler"]
