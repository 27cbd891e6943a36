"""How long ``leader run`` gives a command to stop, bounded by the lease.

A leader believes in its term until ``valid_until = t_sent + ttl * (1 - DRIFT)
- MARGIN`` (:func:`celery_leader.election.timing.validity`), where ``t_sent`` is when its
last acknowledged acquire or renew was sent; the store cannot hand the term to
another replica before ``t_sent + ttl``. The guard therefore starts stopping
the command at ``valid_until - grace - KILL_SLACK`` when no renewal has moved
``valid_until`` on: the signal, ``grace`` seconds, SIGKILL, and ``KILL_SLACK``
for the kernel to end the group, all before the term can pass.

The latest renewal attempt due before that moment is the one sent at ``t_sent +
renew_interval``. Stopping must not begin before that renewal had a fair chance
to be acknowledged, so at most half of what is left after it goes to stopping:

    grace + KILL_SLACK <= (validity(ttl) - renew_interval) / 2

With the defaults (ttl 15 s, renew interval 5 s): (14.845 - 5) / 2 - 0.25 =
4.67 s of grace at most; stopping then starts (validity + renew_interval) / 2 =
9.9 s after the last acknowledged renewal was sent, once the renewal due at
5 s and its retries (every renew_interval / 4) have failed. With ttl 2 s and
renew interval 0.667 s: 0.40 s.
"""

from __future__ import annotations

from ..election.timing import validity

#: From SIGKILL to the group's processes being gone, and the guard's wake-up
#: latency on a loaded host.
KILL_SLACK = 0.25

#: The grace when ``--grace`` is not given, unless the ttl allows less.
DEFAULT_GRACE = 5.0


def max_grace(ttl: float, renew_interval: float) -> float:
    """The longest grace the lease leaves between a missed renewal and its end."""
    return (validity(ttl) - renew_interval) / 2 - KILL_SLACK
