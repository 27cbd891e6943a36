"""The console in a Django project:
``path("leader/", include("celery_leader.contrib.django.urls"))``.

Every page and JSON twin of the console under that prefix, for logged-in staff users
with ``celery_leader.view_console``; actions also need ``celery_leader.change_console``
and ``leader_console_write``. See :mod:`celery_leader.contrib.django.views`.
"""

from __future__ import annotations

from django.urls import re_path  # type: ignore[import-untyped, unused-ignore]

from .views import console

app_name = "celery_leader"
urlpatterns = [re_path(r"^(?P<path>.*)$", console, name="console")]
