"""Helpers the test suite uses to run real servers, processes and faults."""
