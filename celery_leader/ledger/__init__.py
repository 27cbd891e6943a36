"""The run ledger: one record per beat-sent slot, so that workers run each slot once.

:mod:`.records` is the format of a record; :mod:`.guard` is what a worker does
around a slot's body (record it started, keep it alive, record how it ended);
:mod:`.target` is where and how long it writes them.
The records live in the store's run records
(:meth:`~celery_leader.backends.RunStore.put`), under the beat election.
"""

from .guard import Decision, RunGuard
from .records import RunRecord
from .target import LedgerTarget

__all__ = ["Decision", "LedgerTarget", "RunGuard", "RunRecord"]
