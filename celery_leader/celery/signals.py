"""Celery signals sent when an instance gains or loses leadership.

Both are sent with ``sender`` = the election name and the keyword arguments
``lease``, ``epoch`` and ``instance_id``, in the thread that noticed the change:
receivers must return quickly.
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
