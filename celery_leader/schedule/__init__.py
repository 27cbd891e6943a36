"""The slot protocol, written once for Celery beat and the Dramatiq scheduler.

Framework-free: it imports neither Celery nor Dramatiq.
"""
