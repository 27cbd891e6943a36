"""The command line: ``celery leader ...`` and ``python -m celery_leader ...``."""
