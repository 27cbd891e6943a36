"""Test suite; a package so that tests import their apps as ``tests.apps``."""
