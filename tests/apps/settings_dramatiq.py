"""The Dramatiq app of the bad-settings tests (see :mod:`tests.apps.settings_app`)."""

from tests.apps.settings_app import dramatiq_broker

broker = dramatiq_broker()
