"""A Django app for dramatiq-crontab in the Dramatiq benchmark (``crontab`` loads its tasks)."""
