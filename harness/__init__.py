"""Harness shared by the tests and the benchmarks: real servers, a TCP proxy,
process groups and deadline waits. Not part of the installed package."""
