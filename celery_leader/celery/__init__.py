"""Everything that imports Celery: beat, the worker bootsteps, ``@leader_only``, the CLI.

Nothing outside this package imports Celery (``tests/test_imports.py`` checks);
the framework-free core (lease, stores, config, the slot protocol) serves
Dramatiq too.
"""
