"""The elector's timing arithmetic, and the bounds on ttl and renew interval it needs.

Leadership is a deadline. A holder believes its term until

    valid_until = t_sent + ttl * (1 - DRIFT) - MARGIN

where ``t_sent`` is when it *sent* the last acquire or renewal the store
acknowledged. The store starts the ttl when it *receives* that request, at or
after ``t_sent``, and counts it on its own clock. If that clock runs up to DRIFT
faster than ours, ``ttl`` store seconds last at least ``ttl / (1 + DRIFT) >=
ttl * (1 - DRIFT)`` of ours, so the store's copy of the term ends no earlier
than ``t_sent + ttl * (1 - DRIFT)``; MARGIN covers its rounding. A holder that
is paused, cut off or stuck therefore stops believing before anyone else can
win, and nobody has to notice.
"""

from __future__ import annotations

from ..exceptions import ConfigError

#: Largest clock *rate* difference assumed between this host and the store
#: (1 %, far above NTP-disciplined clocks' ~0.01 %). Safety holds while real
#: drift stays below it; beat's fenced claims keep slots unique even beyond.
DRIFT = 0.01
#: Covers the store's one-millisecond expiry granularity and rounding.
MARGIN = 0.005
#: The shortest deadline a store call gets: under it a healthy store on a busy
#: host misses deadlines.
STORE_TIMEOUT_FLOOR = 0.05
#: The longest ttl every store can represent: PostgreSQL's
#: ``idle_session_timeout`` (the ttl there) is a 32-bit count of milliseconds.
MAX_TTL = 2_147_483.0
#: Followers wake this long after the holder's term should have run out, so
#: they do not find it a hair before the store expires it.
FOLLOWER_SLACK = 0.005
#: How often a leader with a health check asks it (a local call, no I/O), so
#: an unhealthy leader hands over within this of the check failing.
HEALTH_POLL = 0.1


def validity(ttl: float) -> float:
    """How long a term is trusted after its acquire or renew request was sent."""
    return ttl * (1 - DRIFT) - MARGIN


def store_timeout(ttl: float, renew_interval: float) -> float:
    """Deadline of one store call: a renewal sent ``renew_interval`` after the last good one
    must give up while the term is still valid (``ttl - renew_interval`` left), so the leader
    can retry; and no call should outlast one renew interval, the loop's beat."""
    return max(STORE_TIMEOUT_FLOOR, min(renew_interval, ttl - renew_interval))


def check_timing(ttl: float, renew: float, ttl_name: str, renew_name: str) -> None:
    """A leader must renew before its belief (shorter than the ttl) runs out."""
    if not 0 < renew < validity(ttl):
        raise ConfigError(
            f"{renew_name} must be greater than 0 and smaller than {ttl_name} less "
            f"{DRIFT:.0%} and {MARGIN * 1000:g} ms, so that the leader renews before its "
            f"lease runs out (got renew interval {renew:g} s, ttl {ttl:g} s)"
        )


def check_ttl(ttl: float, renew: float, ttl_name: str, renew_name: str) -> None:
    """Bounds of the ttl that the timing arithmetic needs, one line each. Low end: below
    :data:`STORE_TIMEOUT_FLOOR` a renewal can outlast the leader's belief, and the lease flaps
    (ttl 0.01: 29 hand-overs in 9 s). High end: :data:`MAX_TTL`."""
    if min(renew, ttl - renew) < STORE_TIMEOUT_FLOOR - 1e-9:  # ttl / 3 rounds down
        raise ConfigError(
            f"{ttl_name} is too short: {renew_name} ({renew:g} s) and {ttl_name} less "
            f"{renew_name} ({ttl - renew:g} s) must each be at least the store call "
            f"deadline floor of {STORE_TIMEOUT_FLOOR * 1000:g} ms, so a renewal can answer "
            f"before the lease runs out (ttl {ttl:g} s; at least {3 * STORE_TIMEOUT_FLOOR:g} s "
            "with the default renew interval)"
        )
    if ttl > MAX_TTL:
        raise ConfigError(
            f"{ttl_name} must be at most {MAX_TTL:,.0f} s (about 24.8 days, the longest ttl "
            f"every store can represent; got {ttl:g})"
        )
