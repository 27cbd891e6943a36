"""Chaos on etcd: three `celery beat` replicas on a three-member etcd cluster.

The replicas, broker tap and measurements are test_beat_chaos's. Each replica
reaches each etcd member through a TCP proxy of its own, so one replica can be
cut off from the whole cluster. Faults, one after the other: SIGKILL, SIGTERM
and SIGSTOP of the leading replica, a partition of it, SIGKILL of the etcd
member that leads Raft, and the loss of quorum (two members killed: nobody may
lead) and its return. Checked throughout: no slot is published twice, epochs
only grow.

Run with ``-s`` to see the table of measured gaps.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.etcd import EtcdCluster
from harness.procs import Procs
from harness.procs import signal as send_signal
from harness.proxy import TcpProxy
from tests.test_beat_chaos import (  # noqa: F401 - broker, tap and beat_holder are fixtures
    BEAT,
    FAILOVER,
    GRACEFUL,
    HOLD,
    TTL,
    BrokerTap,
    Holder,
    Replicas,
    Row,
    beat_env,
    beat_holder,
    broker,
    hold_fault_until,
    measure,
    report,
    steady,
    step_downs,
    tap,
    wait_step_down,
)

pytestmark = [pytest.mark.slow, pytest.mark.timing]

#: A holder that stops renewing is replaced once etcd revokes its lease: at most
#: ttl after its last keep-alive, plus up to 0.5 s because etcd looks for expired
#: leases only every 0.5 s (Redis expires a key to the millisecond); then the
#: take-over and up to one period, as in FAILOVER.
ETCD_FAILOVER = FAILOVER + 0.5

#: Quorum back: etcd's new Raft leader restarts every lease's TTL plus one election
#: timeout (1 s) before the old holder's lease can run out, and its expiry loop
#: runs every 0.5 s; then a follower takes over as after a crash.
QUORUM_BACK = TTL + 1.0 + 0.5 + 0.5


def test_three_beats_on_etcd_through_every_fault(
    redis_url: str,
    etcd_cluster: EtcdCluster,
    etcd_url: str,
    beat_holder: Callable[[str], Holder],  # noqa: F811
    tcp_proxy: Callable[[str, int], TcpProxy],
    procs: Procs,
    tap: BrokerTap,  # noqa: F811
    tmp_path: Path,
) -> None:
    # proxies[replica][member]: a replica's whole view of the cluster can be held.
    proxies = [[tcp_proxy("127.0.0.1", m.port) for m in etcd_cluster.members] for _ in range(3)]
    urls = ["etcd://" + ",".join(f"127.0.0.1:{p.port}" for p in mine) for mine in proxies]
    beats = Replicas(procs, tmp_path, BEAT, beat_env(redis_url), urls, beat_holder(etcd_url))
    rows: list[Row] = []
    problems: list[str] = []
    epochs: list[int] = []

    def measured(row: Row, term_before: int) -> None:
        # A Raft election restarts every lease's TTL (plus 1 s): name it when it happened.
        term = etcd_cluster.raft_term()
        if term != term_before:
            row.fault += f" (Raft term {term_before} -> {term})"
        rows.append(row)

    try:
        beats.start()
        steady(tap)

        place, proc, epoch = beats.leader()
        term = etcd_cluster.raft_term()
        at = time.monotonic()
        send_signal(proc, signal.SIGKILL)
        measured(measure(tap, "crash (SIGKILL)", at, epoch, ETCD_FAILOVER), term)
        beats.replace(place)
        steady(tap)

        place, proc, epoch = beats.leader()
        term = etcd_cluster.raft_term()
        at = time.monotonic()
        send_signal(proc, signal.SIGTERM)
        measured(measure(tap, "graceful (SIGTERM)", at, epoch, GRACEFUL), term)
        proc.wait_for_line(r"no longer leads 'beat' \(epoch \d+\): stopping", timeout=5)
        beats.replace(place)
        steady(tap)

        place, proc, epoch = beats.leader()
        before = step_downs(proc)
        term = etcd_cluster.raft_term()
        at = time.monotonic()
        for proxy in proxies[place]:
            proxy.hold()
        partition = f"partition (all members held {HOLD:g} s)"
        measured(measure(tap, partition, at, epoch, ETCD_FAILOVER), term)
        hold_fault_until(at + HOLD)
        for proxy in proxies[place]:
            proxy.release()
        wait_step_down(proc, before)
        steady(tap)

        place, proc, epoch = beats.leader()
        before = step_downs(proc)
        term = etcd_cluster.raft_term()
        at = time.monotonic()
        send_signal(proc, signal.SIGSTOP)
        measured(measure(tap, f"pause (SIGSTOP {HOLD:g} s)", at, epoch, ETCD_FAILOVER), term)
        hold_fault_until(at + HOLD)
        send_signal(proc, signal.SIGCONT)
        resumed = time.monotonic()
        wait_step_down(proc, before)
        steady(tap)
        late = [p.slot for p in tap.after(resumed) if p.pid == proc.pid]
        if len(late) > 1:
            problems.append(f"the paused ex-leader published {late} after SIGCONT")

        # The Raft leader dies: the others elect one and carry every lease over
        # (etcd restarts their TTLs), so the holder may keep its term.
        _, _, epoch = beats.leader()
        epochs.append(epoch)
        raft_leader = etcd_cluster.raft_leader()
        at = time.monotonic()
        raft_leader.kill()
        rows.append(measure(tap, "etcd Raft leader killed", at, None, ETCD_FAILOVER))
        raft_leader.start()
        steady(tap)

        # Quorum lost: nobody may lead until it is back.
        _, _, epoch = beats.leader()
        epochs.append(epoch)
        killed = etcd_cluster.lose_quorum()
        hold_fault_until(killed + TTL + 1.0)
        # Nothing may be sent until a member is relaunched. Quorum is back once the
        # first one serves (etcd may take seconds to elect a leader), which can be
        # well before the last one serves: time the return from it.
        relaunched = time.monotonic()
        back = etcd_cluster.regain_quorum()
        quorum = f"quorum lost, then back (served {back - relaunched:.1f} s after the relaunch)"
        rows.append(measure(tap, quorum, back, None, QUORUM_BACK, on="first"))
        while_down = [p for p in tap.published() if killed + TTL < p.seen < relaunched]
        if while_down:
            problems.append(f"published without quorum: {while_down}")
        _, _, epoch = beats.leader()
        epochs.append(epoch)
        if epochs != sorted(epochs):
            problems.append(f"epochs went back: {epochs}")
        steady(tap)

        dead = [proc for proc in beats.current if not proc.alive]
        if dead:
            problems.append(f"replicas exited: {dead}")
    finally:
        problems += report("three `celery beat` replicas, three-member etcd", rows, tap)
    assert not problems, "\n".join(problems)
