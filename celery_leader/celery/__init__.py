"""Everything that imports Celery: beat, the worker bootsteps, ``@leader_only``, the CLI.
"""
