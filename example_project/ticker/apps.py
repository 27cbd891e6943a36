"""The example app."""

from django.apps import AppConfig


class TickerConfig(AppConfig):
    """Periodic tasks of the example project."""

    name = "ticker"
