"""The fenced-state part of the store: an election's records in a table,
written only by the session that holds the election's named lock."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...exceptions import StoreMisconfigured, StoreUnavailable
from ..fenced import Write
from ..session_lock import SessionGone
from .session import Connector, Session
from .sql import CLAIM_NEW, CLAIM_UPDATE, LOAD_STATE


class StateTable:
    """Records of the elections under one key prefix, in ``celery_leader_state``."""

    def __init__(self, connector: Connector, key_prefix: str) -> None:
        self._db = connector
        self._prefix = key_prefix

    def load(self, session: Session, election: str) -> dict[str, str]:
        """Key -> value, as stored."""
        rows = self._db.execute(
            session, LOAD_STATE, {"prefix": self._prefix, "election": election}
        )[0].rows
        return {str(entry): str(value) for entry, value in rows}

    def compare_and_set(
        self,
        session: Session,
        election: str,
        lock: str,
        writes: Sequence[Write],
        replica_acks: int | None,
    ) -> list[bool]:
        """Apply ``writes`` in order on ``session`` (which must hold ``lock``), in one
        transaction and one round trip; one result each.

        Every statement writes only while ``IS_USED_LOCK`` says this very
        session holds the lock. A write naming a key again sees the writes
        before it. The results count only once ``COMMIT`` answered: when the
        session ends first, :class:`SessionGone` is raised and the caller
        reports every write failed (a slot is then skipped, never sent twice).
        """
        if replica_acks:
            raise StoreMisconfigured(
                f"leader_replica_acks is {replica_acks}, but the MySQL store cannot confirm "
                f"that a replica of {self._db.target} acknowledged a claim (semi-synchronous "
                "replication falls back to asynchronous without telling the client): "
                "set leader_replica_acks to auto or 0 (see the MySQL store's docs on fail-over)"
            )
        base = {"prefix": self._prefix, "election": election, "lock": lock}
        statements: list[str] = ["START TRANSACTION"]
        params: dict[str, Any] = dict(base)
        for i, w in enumerate(writes):
            names = {k: f"%({k}{i})s" for k in ("entry", "new", "expected")}
            template = CLAIM_NEW if w.expected is None else CLAIM_UPDATE
            for k, placeholder in names.items():
                template = template.replace(f"%({k})s", placeholder)
            statements.append(template)
            params.update({f"entry{i}": w.key, f"new{i}": w.new, f"expected{i}": w.expected})
        statements.append("COMMIT")
        try:
            results = self._db.execute(session, ";\n".join(statements), params)
        except SessionGone:
            raise
        except StoreUnavailable:
            # A statement failed (a row lock not granted in time ...): the
            # transaction is still open on the session. End it before anything
            # else runs there; if even that fails, the session is unusable.
            try:
                self._db.execute(session, "ROLLBACK")
            except StoreUnavailable as exc:
                raise SessionGone(str(exc)) from exc
            raise
        return [r.rowcount == 1 for r in results[1 : 1 + len(writes)]]
