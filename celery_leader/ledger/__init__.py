"""The run ledger: one record per beat-sent slot, so that workers run each slot once
(records in the store's run records, under the beat election)."""

from .guard import Decision, RunGuard
from .records import RunRecord
from .target import LedgerTarget

__all__ = ["Decision", "LedgerTarget", "RunGuard", "RunRecord"]
