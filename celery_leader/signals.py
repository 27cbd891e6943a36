"""Celery signals sent when an instance gains or loses leadership.

Both are sent with ``sender`` = the election name and the keyword arguments
``lease`` (the :class:`~celery_leader.lease.Lease`), ``epoch`` (fencing token of
the term that starts or ends) and ``instance_id``. Receivers run in the thread
that noticed the change (the lease's own thread, or the one calling ``stop()``),
so they must return quickly. Celery logs and swallows a receiver's exception.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

#: Sent when this instance starts leading an election.
elected = Signal(name="celery_leader.elected")

#: Sent when this instance stops leading: lease expired or lost, resigned, or stopped.
demoted = Signal(name="celery_leader.demoted")
