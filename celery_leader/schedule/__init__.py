"""The slot protocol, written once for Celery beat and the Dramatiq scheduler (framework-free)."""
