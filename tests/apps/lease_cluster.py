"""Test-side driver for ``lease_proc.py``: spawn, fault, sample and audit lease processes.

Two views of "who leads", both from records the processes make themselves (see
the docstring of ``lease_proc.py`` for why each record bounds the belief from
above before the belief starts):

* **Live sampling**: a thread in the test reads every process's slot of a shared
  mmap every 10 ms and counts the processes whose ``[start, min(bound, end))``
  contains the sampling instant.
* **Intervals**: after the run, every term of every process, from its event log,
  as ``[start, end)`` in CLOCK_MONOTONIC; no two may overlap and epochs must grow
  in the order the terms began.

A SIGKILLed process runs no code once the kernel delivered the signal: its belief
is cut at the instant ``kill()`` returned. The only refinement: if another term
began while ``kill()`` was in flight (possible with the file store, which hands
the flock over as the killed process exits), the killed term is cut at that
start, because the hand-over itself proves the process had died.
"""

from __future__ import annotations

import itertools
import json
import mmap
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.procs import Proc, Procs
from harness.procs import signal as send_signal
from harness.waiting import wait_for
from tests.apps.lease_proc import INF, SLOT_SIZE, read_slot

SCRIPT = Path(__file__).with_name("lease_proc.py")
SAMPLE_INTERVAL = 0.01


@dataclass
class Member:
    slot: int
    ident: str
    proc: Proc
    events_path: Path
    kill_sent: float | None = None  # monotonic() just before SIGKILL
    dead_at: float | None = None  # monotonic() just after kill() returned
    paused_at: float | None = None
    _events: list[dict[str, Any]] = field(default_factory=list)
    _offset: int = 0

    def events(self) -> list[dict[str, Any]]:
        """Every complete event line so far (read incrementally)."""
        try:
            with self.events_path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return self._events
        last_newline = data.rfind(b"\n")
        if last_newline >= 0:
            for line in data[: last_newline + 1].splitlines():
                self._events.append(json.loads(line))
            self._offset += last_newline + 1
        return list(self._events)

    def find(self, ev: str, after: float = -INF, **match: Any) -> dict[str, Any] | None:
        for event in self.events():
            if event["ev"] == ev and event["t"] >= after:
                if all(event.get(k) == v for k, v in match.items()):
                    return event
        return None

    def wait_event(self, ev: str, timeout: float, after: float = -INF, **match: Any) -> dict:
        return wait_for(
            lambda: self.find(ev, after, **match),
            timeout,
            message=lambda: (
                f"{self.ident}: no {ev!r} event after {after}; events:\n"
                + "\n".join(json.dumps(e) for e in self.events()[-15:])
                + f"\noutput:\n{self.proc.output()[-3000:]}"
            ),
        )

    def __repr__(self) -> str:
        return f"<Member {self.ident} slot={self.slot} pid={self.proc.pid}>"


@dataclass
class Term:
    member: Member
    epoch: int
    start: float
    bound: float
    end: float

    def __repr__(self) -> str:
        return (
            f"<Term {self.member.ident} epoch={self.epoch} "
            f"[{self.start:.4f}, {self.end:.4f}) bound={self.bound:.4f}>"
        )


class LeaseCluster:
    """Lease processes on one election, each in its own slot of a shared mmap."""

    def __init__(
        self,
        procs: Procs,
        directory: Path,
        url: str,
        *,
        ttl: float,
        renew: float | None = None,
        election: str = "chaos",
        prefix: str = "celery_leader",
        slots: int = 8,
        settle_follows: int = 2,
    ) -> None:
        self.procs = procs
        self.settle_follows = settle_follows
        self.directory = directory
        self.url = url
        self.ttl = ttl
        self.renew = renew if renew is not None else ttl / 3
        self.election = election
        self.prefix = prefix
        self.slots_path = directory / "slots.bin"
        self.slots_path.write_bytes(bytes(SLOT_SIZE * slots))
        self._file = self.slots_path.open("r+b")
        self._mm = mmap.mmap(self._file.fileno(), 0)
        self.current: dict[int, Member] = {}
        self.members: list[Member] = []
        self._spawned = 0

    # -- processes ------------------------------------------------------------

    def spawn(
        self,
        slot: int,
        *,
        url: str | None = None,
        ident: str | None = None,
        extra: Iterable[str] = (),
    ) -> Member:
        old = self.current.get(slot)
        if old is not None and old.proc.alive:
            raise RuntimeError(f"slot {slot} still has a live process {old}")
        self._spawned += 1
        ident = ident or f"m{slot}.{self._spawned}"
        self._mm[slot * SLOT_SIZE : (slot + 1) * SLOT_SIZE] = bytes(SLOT_SIZE)
        events_path = self.directory / f"events-{ident}.jsonl"
        proc = self.procs.spawn_python(
            SCRIPT,
            "--url", url or self.url,
            "--id", ident,
            "--events", str(events_path),
            "--slots", str(self.slots_path),
            "--slot", str(slot),
            "--election", self.election,
            "--prefix", self.prefix,
            "--ttl", str(self.ttl),
            "--renew", str(self.renew),
            *extra,
        )  # fmt: skip
        member = Member(slot, ident, proc, events_path)
        self.current[slot] = member
        self.members.append(member)
        return member

    def kill(self, member: Member) -> float:
        """SIGKILL; returns the instant just before the signal was sent."""
        member.kill_sent = time.monotonic()
        send_signal(member.proc, signal.SIGKILL)
        member.dead_at = time.monotonic()
        member.proc.wait(timeout=10)
        return member.kill_sent

    def terminate(self, member: Member) -> float:
        """SIGTERM (the process calls ``lease.stop()``); returns when it was sent."""
        sent = time.monotonic()
        send_signal(member.proc, signal.SIGTERM)
        return sent

    def pause(self, member: Member) -> float:
        member.paused_at = time.monotonic()
        send_signal(member.proc, signal.SIGSTOP)
        return member.paused_at

    def resume(self, member: Member) -> float:
        sent = time.monotonic()
        send_signal(member.proc, signal.SIGCONT)
        member.paused_at = None
        return sent

    # -- live view ------------------------------------------------------------

    def believers(self, t: float | None = None) -> list[Member]:
        """Members whose recorded belief covers ``t`` (default: now, read before the slots)."""
        t = time.monotonic() if t is None else t
        found: list[tuple[Member, float]] = []
        for slot, member in list(self.current.items()):
            record = read_slot(self._mm, slot)
            if record is None:
                continue
            _, start, bound, end = record
            if start <= t < min(bound, end, member.dead_at or INF):
                found.append((member, start))
        return self._cut_killed([m for m, _ in found], {m.ident: s for m, s in found}, t)

    @staticmethod
    def _cut_killed(members: list[Member], starts: dict[str, float], t: float) -> list[Member]:
        if len(members) < 2:
            return members
        kept = []
        for m in members:
            others = [starts[o.ident] for o in members if o is not m]
            killed_in_flight = m.kill_sent is not None and any(s >= m.kill_sent for s in others)
            if not killed_in_flight:
                kept.append(m)
        return kept

    def leader(self) -> Member | None:
        found = self.believers()
        return found[0] if len(found) == 1 else None

    def wait_leader(self, timeout: float, *, other_than: Member | None = None) -> Member:
        def check() -> Member | None:
            found = self.leader()
            return found if found is not None and found is not other_than else None

        return wait_for(check, timeout, message=lambda: f"no leader; {self.describe()}")

    def wait_settled(self, member: Member, since: float, timeout: float) -> None:
        """Wait until ``member`` leads, or follows: found a holder since ``since``.

        ``settle_follows`` times (two by default: the second shows the member is
        past its first wait). A member back from a pause sits out one renew
        interval first.
        """

        def settled() -> bool:
            follows = [e for e in member.events() if e["ev"] == "follow" and e["t"] >= since]
            return len(follows) >= self.settle_follows or member in self.believers()

        wait_for(settled, timeout, message=lambda: f"{member} did not settle; {self.describe()}")

    def replace(self, gone: Member, timeout: float) -> Member:
        """Start a successor in ``gone``'s slot; return the leader once it has settled."""
        successor = self.spawn(gone.slot)
        leader = self.wait_leader(5)
        self.wait_settled(successor, 0.0, timeout)
        return leader

    def hand_overs(
        self,
        leader: Member,
        fault: Callable[[Member], float],
        rounds: int,
        timeout: float,
        startup: float,
        check: Callable[[Member], None] = lambda gone: None,
    ) -> list[float]:
        """Hit the leader with ``fault`` ``rounds`` times, replacing it each time.

        Returns, per round, the seconds from the fault to the next member's term;
        ``check`` looks at the member that was hit before it is replaced.
        """
        taken = []
        for _ in range(rounds):
            at = fault(leader)
            term = self.wait_term_after(at, timeout, other_than=leader)
            taken.append(term.start - at)
            check(leader)
            leader = self.replace(leader, startup)
        return taken

    @contextmanager
    def sampling(self, interval: float = SAMPLE_INTERVAL) -> Iterator[Samples]:
        """Sample the believers every ``interval`` seconds in a thread, for the block."""
        samples = Samples(interval)
        stop = threading.Event()

        def run() -> None:
            next_at = time.monotonic()
            while not stop.is_set():
                t = time.monotonic()
                samples.add(t, self.believers(t))
                next_at += interval
                delay = next_at - time.monotonic()
                if delay < 0:
                    next_at = time.monotonic()
                    delay = 0
                stop.wait(delay)

        thread = threading.Thread(target=run, name="lease-sampler", daemon=True)
        thread.start()
        try:
            yield samples
        finally:
            stop.set()
            thread.join(timeout=5)

    # -- after the fact -------------------------------------------------------

    def terms(self) -> list[Term]:
        """Every term of every member, sorted by start, with killed ones cut (see module doc)."""
        terms: list[Term] = []
        for member in self.members:
            by_epoch: dict[int, Term] = {}
            released: dict[int, float] = {}
            for e in member.events():
                if e["ev"] == "acquired":
                    by_epoch[e["epoch"]] = Term(member, e["epoch"], e["start"], e["bound"], INF)
                elif e["ev"] == "renewed" and e["epoch"] in by_epoch:
                    term = by_epoch[e["epoch"]]
                    term.bound = max(term.bound, e["bound"])
                elif e["ev"] == "release":
                    released.setdefault(e["epoch"], e["end"])
            for epoch, term in by_epoch.items():
                term.end = min(term.bound, released.get(epoch, INF), member.dead_at or INF)
                terms.append(term)
        terms.sort(key=lambda term: term.start)
        for term in terms:
            kill_sent = term.member.kill_sent
            if kill_sent is None or term.end <= kill_sent:
                continue
            later = [o.start for o in terms if o.member is not term.member and o.start >= kill_sent]
            if later:
                term.end = min(term.end, min(later))
        return terms

    def check_terms(self) -> list[Term]:
        """Assert: no two terms overlap; epochs strictly increase in order of start."""
        terms = self.terms()
        problems = []
        longest: Term | None = None  # the term seen so far that ends last
        previous: Term | None = None
        for term in terms:
            if longest is not None and term.start < longest.end:
                problems.append(f"overlap: {longest} and {term}")
            if previous is not None and term.epoch <= previous.epoch:
                problems.append(f"epoch did not grow: {previous} then {term}")
            if longest is None or term.end > longest.end:
                longest = term
            previous = term
        assert not problems, "\n".join(problems) + "\nall terms:\n" + "\n".join(map(repr, terms))
        return terms

    def first_term_after(self, t: float, *, other_than: Member | None = None) -> Term | None:
        for term in self.terms():
            if term.start >= t and term.member is not other_than:
                return term
        return None

    def wait_term_after(
        self, t: float, timeout: float, *, other_than: Member | None = None
    ) -> Term:
        return wait_for(
            lambda: self.first_term_after(t, other_than=other_than),
            timeout,
            message=lambda: f"no term started after {t:.3f}; {self.describe()}",
        )

    def describe(self) -> str:
        lines = [f"now {time.monotonic():.4f}"]
        for member in self.members:
            state = "alive" if member.proc.alive else f"exit {member.proc.popen.returncode}"
            lines.append(f"{member!r} {state}; last events:")
            lines += ["    " + json.dumps(e) for e in member.events()[-6:]]
        return "\n".join(lines)

    def close(self) -> None:
        self._mm.close()
        self._file.close()


class Samples:
    """What the sampling thread saw: (instant, believers) every ``interval``."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.points: list[tuple[float, tuple[str, ...]]] = []
        self._lock = threading.Lock()

    def add(self, t: float, members: list[Member]) -> None:
        with self._lock:
            self.points.append((t, tuple(m.ident for m in members)))

    def snapshot(self) -> list[tuple[float, tuple[str, ...]]]:
        with self._lock:
            return list(self.points)

    def several(self) -> list[tuple[float, tuple[str, ...]]]:
        return [p for p in self.snapshot() if len(p[1]) > 1]

    def none_outside(
        self, windows: list[tuple[float, float]], begin: float, end: float
    ) -> list[tuple[float, tuple[str, ...]]]:
        """Samples in [begin, end) with no leader and outside every allowed window."""
        return [
            (t, who)
            for t, who in self.snapshot()
            if begin <= t < end and not who and not any(a <= t < b for a, b in windows)
        ]

    def max_gap(self) -> float:
        times = [t for t, _ in self.snapshot()]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def stats(values: list[float]) -> str:
    if not values:
        return "n=0"
    return (
        f"n={len(values)} median={statistics.median(values) * 1000:.1f} ms "
        f"max={max(values) * 1000:.1f} ms"
    )


@dataclass
class Fault:
    kind: str
    at: float  # monotonic() just before the signal
    member: Member
    handover: float | None = None  # start of the next term (another member's) minus ``at``
    resumed_at: float | None = None  # for "stop": when SIGCONT was sent


@dataclass
class ChaosReport:
    samples: Samples
    terms: list[Term]
    faults: list[Fault]
    no_leader_unexplained: list[tuple[float, tuple[str, ...]]]
    begin: float
    end: float

    def handovers(self, kind: str) -> list[float]:
        return [f.handover for f in self.faults if f.kind == kind and f.handover is not None]

    def summary(self) -> str:
        kinds = sorted({f.kind for f in self.faults if f.handover is not None})
        parts = [f"{k}: {stats(self.handovers(k))}" for k in kinds]
        return (
            f"{len(self.samples.snapshot())} samples over {self.end - self.begin:.1f} s "
            f"(largest sampling gap {self.samples.max_gap() * 1000:.0f} ms), "
            f"{len(self.terms)} terms, faults {len(self.faults)}; handover " + "; ".join(parts)
        )


def run_chaos(
    cluster: LeaseCluster,
    *,
    size: int,
    duration: float,
    faults: list[str],
    handover_limits: dict[str, float],
    startup_timeout: float = 20.0,
    settle: float = 0.3,
) -> ChaosReport:
    """Run ``size`` lease processes for ``duration`` s while applying ``faults`` in turn.

    Faults (on the current leader unless said otherwise): ``kill`` (SIGKILL),
    ``term`` (SIGTERM: graceful ``stop()``), ``stop`` (SIGSTOP until another
    member leads, then SIGCONT), ``kill_follower``. Killed and terminated members
    are replaced at once. Samples at 10 ms throughout. A sample with no leader is
    allowed only within ``handover_limits[kind]`` after a fault.
    """
    for slot in range(size):
        cluster.spawn(slot)
    done: list[Fault] = []
    windows: list[tuple[float, float]] = []
    slack = max(handover_limits.values()) + 5
    with cluster.sampling() as samples:
        cluster.wait_leader(startup_timeout)
        begin = time.monotonic()
        end = begin + duration
        index = 0
        while True:
            leader = cluster.wait_leader(slack)
            time.sleep(settle)  # pacing: the new term runs a little before the next fault
            if time.monotonic() >= end:
                break
            kind = faults[index % len(faults)]
            index += 1
            if kind == "kill_follower":
                followers = [m for m in cluster.current.values() if m is not leader]
                victim = followers[index % len(followers)]
                done.append(Fault(kind, cluster.kill(victim), victim))
                cluster.wait_settled(cluster.spawn(victim.slot), 0.0, startup_timeout)
                continue
            if kind == "kill":
                at = cluster.kill(leader)
            elif kind == "term":
                at = cluster.terminate(leader)
            elif kind == "stop":
                at = cluster.pause(leader)
            else:
                raise ValueError(kind)
            fault = Fault(kind, at, leader)
            done.append(fault)
            limit = handover_limits[kind]
            windows.append((at, at + limit))
            term = cluster.wait_term_after(at, limit + 5, other_than=leader)
            fault.handover = term.start - at
            if kind == "stop":
                wait_for(lambda: cluster.leader() not in (None, leader), limit + 5)
                fault.resumed_at = cluster.resume(leader)
                cluster.wait_settled(leader, fault.resumed_at, startup_timeout)
            else:
                if kind == "term":
                    leader.proc.wait(timeout=10)
                fresh = cluster.spawn(leader.slot)
                cluster.wait_settled(fresh, 0.0, startup_timeout)
        cluster.wait_leader(slack)
        stop_at = time.monotonic()
    return ChaosReport(
        samples=samples,
        terms=cluster.check_terms(),
        faults=done,
        no_leader_unexplained=samples.none_outside(windows, begin, stop_at),
        begin=begin,
        end=stop_at,
    )


def describe_memory(sample: dict[str, Any]) -> str:
    """One line for a member's "mem" event (its tracemalloc window)."""
    return (
        f"traced heap {sample['end'] / 1024:.1f} KiB, "
        f"{sample['without_imports'] / 1024:.1f} KiB of it not module imports "
        f"(peak {sample['peak'] / 1024:.1f} KiB, "
        f"+{(sample['end'] - sample['begin']) / 1024:.1f} KiB over the window), "
        f"threads {sample['threads_begin']}->{sample['threads_end']}, "
        f"fds {sample['fds_begin']}->{sample['fds_end']}, leader={sample['is_leader']}"
    )
