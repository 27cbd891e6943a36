"""Celery signals sent when an instance gains or loses leadership.

Both are sent with ``sender`` = the election name and the keyword arguments
``lease`` (the :class:`~celery_leader.lease.Lease`), ``epoch`` (fencing token of
the term that starts or ends) and ``instance_id``. Receivers run in the thread
that noticed the change (the lease's own thread, or the one calling ``stop()``),
so they must return quickly. Celery logs and swallows a receiver's exception.

The lease knows nothing of Celery (Dramatiq users have none): the Celery parts
that join an election (beat, the worker bootstep, ``is_leader()`` and
``@leader_only`` outside a worker) pass :data:`SIGNALS` among its observers.
"""

from __future__ import annotations

from ..election.events import Observer
from ..election.lease import Lease
from ..exceptions import missing_extra

try:
    from celery.utils.dispatch import Signal
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "celery") from None

#: Sent when this instance starts leading an election.
elected = Signal(name="celery_leader.elected")

#: Sent when this instance stops leading: lease expired or lost, resigned, or stopped.
demoted = Signal(name="celery_leader.demoted")


def _send(lease: Lease, event: str, epoch: int) -> None:
    signal = elected if event == "elected" else demoted
    signal.send(sender=lease.election, lease=lease, epoch=epoch, instance_id=lease.instance_id)


#: Sends :data:`elected` and :data:`demoted` for the leases it observes.
SIGNALS = Observer(on_transition=_send)
