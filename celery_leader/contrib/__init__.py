"""Integrations with other packages: Django (``celery_leader.contrib.django``, and
``django://ALIAS`` store selection in :mod:`celery_leader.contrib.django_db`)."""
