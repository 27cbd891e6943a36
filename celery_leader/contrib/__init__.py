"""Integrations with other packages (Django, Dramatiq)."""
