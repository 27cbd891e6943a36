"""Integrations with other packages: Django (``celery_leader.contrib.django``)."""
