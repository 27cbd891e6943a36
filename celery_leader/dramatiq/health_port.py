"""``leader_health_port`` in Dramatiq worker processes: one process of the node serves it.

``dramatiq`` forks several worker processes per node, and each campaigns with
a lease of its own; they cannot all listen on one port. Sharing the port
(``SO_REUSEPORT``) would answer each probe from whichever process the kernel
picks, so two probes in a row could disagree. Instead the first worker process
that campaigns binds the port and serves its elections; the others find it
taken, log one DEBUG line and serve nothing. The node's answer is then always
the same process's: its ``/healthz`` fails when that process's lease stops
cycling (the other processes run the same code on the same store), and its
``/leader`` names the holder every process of the node sees. When that process
dies, ``dramatiq`` stops the node, and the port with it.

With ``LeaderMiddleware(scheduler=True)`` the scheduler's fork process serves
the port, and worker processes leave it alone (:mod:`.campaign`).
"""

from __future__ import annotations

import errno
import logging
import os

from ..callbacks import Callbacks
from ..exceptions import ConfigError
from ..health import HealthFile
from ..http_health import LeaderSeen, serve
from ..lease import Lease

logger = logging.getLogger(__name__)

#: Ports another process of this node serves: said once per port, not per election.
_taken: set[int] = set()


class ElectionProbe:
    """One election's record for the health port: made before its lease starts,
    offered to the port once the lease exists (:meth:`offer`)."""

    def __init__(self, port: int) -> None:
        self.port = port
        #: Who this process last saw lead, for ``/leader``.
        self.seen = LeaderSeen()
        #: For the join: ``on_new_leader`` feeds :attr:`seen`.
        self.callbacks = Callbacks(on_new_leader=self.seen)
        self._health: HealthFile | None = None

    def cycle(self, lease: Lease) -> None:
        """After every acquire or renew cycle: refresh the record ``/healthz`` judges.

        A lease thread that stops cycling leaves the record stale: 503.
        """
        if self._health is not None:
            self._health.write(force=False)

    def offer(self, lease: Lease) -> None:
        """Serve ``lease``'s record on the port unless another process of this node does.

        Raises :class:`~celery_leader.exceptions.ConfigError` when the port
        cannot be bound for any other reason (a privileged port, no such address).
        """
        self._health = HealthFile(None, lease)
        if self.port in _taken:
            return
        try:
            serve(self.port, self._health, self.seen)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise ConfigError(f"leader_health_port {self.port}: cannot listen: {exc}") from None
            _taken.add(self.port)
            logger.debug(
                "celery-leader: leader_health_port %d is taken (another worker process of "
                "this node serves it); process %d does not serve it",
                self.port,
                os.getpid(),
            )
            return
        logger.info(
            "celery-leader: process %d serves leader_health_port %d for %r",
            os.getpid(),
            self.port,
            lease.election,
        )
