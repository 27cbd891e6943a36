"""Celery apps the benchmarks run as real ``celery beat`` processes."""
