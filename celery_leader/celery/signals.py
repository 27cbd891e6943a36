"""Celery signals sent when an instance gains or loses leadership.

Both are sent with ``sender`` = the election name and the keyword arguments
``lease`` (the :class:`~celery_leader.lease.Lease`), ``epoch`` (fencing token of
the term that starts or ends) and ``instance_id``. Receivers run in the thread
that noticed the change (the lease's own thread, or the one calling ``stop()``),
so they must return quickly. Celery logs and swallows a receiver's exception.

Importing this module (beat, the worker bootstep and ``@leader_only`` do) is what
connects the signals to every :class:`~celery_leader.lease.Lease` of the process.
"""

from __future__ import annotations

from ..exceptions import missing_extra
from ..lease import Lease, transition_hooks

try:
    from celery.utils.dispatch import Signal
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "celery") from None

#: Sent when this instance starts leading an election.
elected = Signal(name="celery_leader.elected")

#: Sent when this instance stops leading: lease expired or lost, resigned, or stopped.
demoted = Signal(name="celery_leader.demoted")


def _send(event: str, lease: Lease, epoch: int) -> None:
    signal = elected if event == "elected" else demoted
    signal.send(sender=lease.election, lease=lease, epoch=epoch, instance_id=lease.instance_id)


# The lease knows nothing of Celery (Dramatiq users have none): these signals
# are sent through its transition hooks once this module is imported.
transition_hooks.append(_send)
