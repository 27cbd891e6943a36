"""The console's permissions, on a model without a table (Django hangs permissions on
models): ``celery_leader.view_console`` to see the console, and
``celery_leader.change_console`` to pause, resume and run entries from it."""

from __future__ import annotations

from django.db import models  # type: ignore[import-untyped, unused-ignore]


class Console(models.Model):  # type: ignore[misc, unused-ignore]
    """The console, as the object of its permissions; no rows, no table."""

    class Meta:
        managed = False
        default_permissions = ("view", "change")
