"""This process's lease set (celery_leader/election/lease_set.py): one lease per election."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest

from celery_leader.backends import open_store
from celery_leader.election.events import Callbacks, Observer
from celery_leader.election.lease_set import leader_of, lease_set
from celery_leader.settings.config import LeaderConfig
from harness.waiting import wait_for

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def config(**settings: Any) -> LeaderConfig:
    values = {
        "leader_url": f"memory://leases-{uuid.uuid4().hex[:8]}",
        "leader_ttl": 0.6,
        "leader_renew_interval": 0.1,
        "leader_instance_id": "one",
        **settings,
    }
    return LeaderConfig.from_mapping(values)


def test_two_joins_share_one_lease_and_each_hears_of_changes() -> None:
    leases = lease_set(config())
    heard: list[tuple[str, bool]] = []
    first = leases.join("e", on_change=lambda lease: heard.append(("first", lease.is_leader())))
    second = leases.join("e", on_change=lambda lease: heard.append(("second", lease.is_leader())))
    try:
        assert first.lease is second.lease
        wait_for(first.lease.is_leader, 3, message="never elected")
        wait_for(
            lambda: {("first", True), ("second", True)} <= set(heard), 3, message="not told"
        )
    finally:
        leases.stop()
    # Stopping the set demotes the lease, and both members hear of it last.
    assert sorted(heard[-2:]) == [("first", False), ("second", False)], heard


def test_the_lease_ends_when_its_last_member_leaves() -> None:
    leases = lease_set(config())
    heard: list[tuple[str, bool]] = []
    first = leases.join("e", on_change=lambda lease: heard.append(("first", lease.is_leader())))
    second = leases.join("e", on_change=lambda lease: heard.append(("second", lease.is_leader())))
    lease = first.lease
    try:
        wait_for(
            lambda: {("first", True), ("second", True)} <= set(heard), 3, message="not told"
        )
        first.leave()
        told = len(heard)
        assert lease.is_leader(), "a member that leaves early does not end the lease"
        assert leases.elections() == ["e"]
        first.leave()  # twice: nothing more
        assert lease.is_leader()
        second.leave()
        assert not lease.is_leader() and leases.elections() == []
        # The last member hears the demotion; the one that left before does not.
        assert heard[told:] == [("second", False)], heard
        again = leases.join("e")
        assert again.lease is not lease, "a join after the end starts a new lease"
    finally:
        leases.stop()


def test_a_health_check_added_by_any_joiner_makes_the_lease_step_down() -> None:
    leases = lease_set(config())
    broken = threading.Event()
    lease = leases.join("e", health_check=lambda: None).lease
    try:
        wait_for(lease.is_leader, 3, message="never elected")
        leases.join(
            "e", health_check=lambda: "the second joiner is stuck" if broken.is_set() else None
        )
        assert lease.is_leader()
        broken.set()
        wait_for(lambda: not lease.is_leader(), 3, message="still leads")
        assert lease.last_demotion == "unhealthy"
    finally:
        leases.stop()


def test_leaving_the_last_election_closes_the_store_and_a_later_join_starts_afresh() -> None:
    leases = lease_set(config())
    a = leases.join("a")
    b = leases.join("b")
    store = leases.store
    wait_for(a.lease.is_leader, 3, message="never elected")
    a.leave()
    assert not a.lease.is_leader() and leases.elections() == ["b"]
    assert leases.store is store, "b still uses the store"
    b.leave()
    assert leases.elections() == []
    assert leases.store is not store, "the last leave closes the store connection"
    again = leases.join("a")
    try:
        assert again.lease is not a.lease
        wait_for(again.lease.is_leader, 3, message="a new lease of 'a' never elected")
    finally:
        leases.stop()


def test_other_instance_ids_are_other_replicas() -> None:
    url = f"memory://leases-{uuid.uuid4().hex[:8]}"
    one, two = (
        lease_set(config(leader_url=url)),
        lease_set(config(leader_url=url, leader_instance_id="two")),
    )
    assert one is not two
    leases = [one.join("e").lease, two.join("e").lease]
    try:
        wait_for(lambda: any(lease.is_leader() for lease in leases), 3, message="nobody leads")
        assert sum(lease.is_leader() for lease in leases) == 1
    finally:
        one.stop()
        two.stop()


def test_a_forked_child_starts_with_none_of_its_parents_leases() -> None:
    settings = config()
    leases = lease_set(settings)
    lease = leases.join("e").lease
    try:
        wait_for(lease.is_leader, 3, message="never elected")
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what it sees, then leave without cleanup
            mine = lease_set(settings)
            os.write(write, f"{mine is leases} {mine.elections()}".encode())
            os._exit(0)
        os.close(write)
        seen = os.read(read, 200).decode()
        os.close(read)
        os.waitpid(pid, 0)
        assert seen == "False []"
        assert lease.is_leader(), "the child did not touch the parent's lease"
    finally:
        leases.stop()


def test_a_process_that_exits_normally_hands_over_at_once(redis_url: str) -> None:
    # ttl 30 s: without the release at exit, the election would stay held that long.
    code = (
        "from celery_leader.settings.config import LeaderConfig\n"
        "from celery_leader.election.lease_set import lease_set\n"
        f"config = LeaderConfig.from_mapping({{'leader_url': {redis_url!r}, 'leader_ttl': 30,"
        " 'leader_instance_id': 'exiting'})\n"
        "lease = lease_set(config).join('e').lease\n"
        "import time\n"
        "deadline = time.monotonic() + 10\n"
        "while not lease.is_leader() and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "print('leading' if lease.is_leader() else 'not leading', flush=True)\n"
    )
    store = open_store(LeaderConfig.from_mapping({"leader_url": redis_url}))
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        exited = time.monotonic()
        assert done.stdout.strip() == "leading", done.stderr
        holder = store.lock.holder("e")
        assert holder is None, (
            f"{holder} still holds 'e' {time.monotonic() - exited:.2f} s after exit"
        )
    finally:
        store.close()


def test_a_connection_opened_without_a_lease_is_closed_only_while_no_election_is_joined() -> None:
    """What a Dramatiq process that only asked ``holder()`` leaves behind at stop()."""
    leases = lease_set(config())
    asked = leases.store  # opened by a holder() call, no lease
    leases.close_if_idle()
    assert leases.store is not asked, "an idle connection is closed"
    member = leases.join("e")
    try:
        used = leases.store
        leases.close_if_idle()
        assert leases.store is used, "a joined election keeps its connection"
        wait_for(member.lease.is_leader, 3, message="never elected")
    finally:
        leases.stop()


def test_members_bring_callbacks_and_followers_hear_of_new_leaders() -> None:
    """One validated Callbacks object per member; on_new_leader fires on a follower too."""
    one, two = lease_set(config()), None
    heard: list[tuple[str, str, object]] = []

    def callbacks(who: str) -> Callbacks:
        return Callbacks(
            on_started=lambda lease: heard.append((who, "started", lease.epoch)),
            on_stopped=lambda lease: heard.append((who, "stopped", None)),
            on_new_leader=lambda lease, holder: heard.append(
                (who, "new leader", (holder.instance_id, holder.epoch))
            ),
        )

    leader = one.join("e", callbacks=callbacks("one"))
    try:
        wait_for(leader.lease.is_leader, 3, message="never elected")
        two = lease_set(config(leader_url=one.config.url, leader_instance_id="two"))
        two.join("e", callbacks=callbacks("two"))
        wait_for(lambda: ("two", "new leader", ("one", 1)) in heard, 3, message="follower not told")
        # A late member of a lease that leads already hears on_started at once.
        late = one.join("e", callbacks=callbacks("late"))
        assert ("late", "started", 1) in heard
        late.leave()
    finally:
        one.stop()
        if two is not None:
            wait_for(lambda: ("two", "started", 2) in heard, 3, message="two never took over")
            two.stop()
    # Per member: lease one's own news and lease two's come from two lease threads, so
    # two may hear of one's term before one's own on_new_leader runs.
    ones = [h for h in heard if h[0] == "one"]
    assert ones[:2] == [("one", "started", 1), ("one", "new leader", ("one", 1))], heard
    assert ("one", "stopped", None) in heard and ("two", "stopped", None) in heard
    assert ("two", "new leader", ("two", 2)) in heard


def test_members_hear_started_and_stopped_in_pairs_whatever_another_member_raises() -> None:
    """A member's on_started raising makes the lease step down unannounced: the
    members told "started" before it, and the one that raised, hear "stopped"."""
    leases = lease_set(config())
    heard: list[tuple[str, str, object]] = []
    raised = threading.Event()

    def fails_once(lease: Any) -> None:
        heard.append(("second", "started", lease.epoch))
        if not raised.is_set():
            raised.set()
            raise RuntimeError("the second member cannot start")

    leases.join(
        "e",
        callbacks=Callbacks(
            on_started=lambda lease: heard.append(("first", "started", lease.epoch)),
            on_stopped=lambda lease: heard.append(("first", "stopped", None)),
        ),
        start=False,
    )
    leases.join(
        "e",
        callbacks=Callbacks(
            on_started=fails_once,
            on_stopped=lambda lease: heard.append(("second", "stopped", None)),
        ),
    )
    try:
        # The second term (after the failed one's sit-out) is announced.
        wait_for(lambda: ("second", "started", 2) in heard, 5, message="never elected again")
    finally:
        leases.stop()
    for who in ("first", "second"):
        told = [event for name, event, _ in heard if name == who]
        assert told == ["started", "stopped", "started", "stopped"], (who, heard)


def test_a_term_whose_on_started_raised_is_never_shown_to_on_change_as_led() -> None:
    """on_change members hear a term once it is announced. A term a member's
    on_started refused is never announced: it must not reach them as led (a
    Dramatiq gate would resume its consumer for it, and hear no more once the
    lease stepped down unannounced)."""
    leases = lease_set(config())
    seen: list[int | None] = []
    raised = threading.Event()

    def fails_once(lease: Any) -> None:
        if not raised.is_set():
            raised.set()
            raise RuntimeError("cannot start")

    leases.join("e", on_change=lambda lease: seen.append(lease.epoch), start=False)
    second = leases.join("e", callbacks=Callbacks(on_started=fails_once))
    try:
        # The second term (after the refused one's sit-out) is announced.
        wait_for(lambda: 2 in seen, 5, message="never elected again")
        assert raised.is_set()
        # The refused term (epoch 1) never reached on_change as led.
        assert 1 not in seen, seen
    finally:
        second.leave()
        leases.stop()


def test_a_join_that_fails_leaves_nothing_behind() -> None:
    leases = lease_set(config())
    heard: list[str] = []
    cycles: list[int] = []
    first = leases.join("e", on_cycle=lambda lease: cycles.append(1))
    lease = first.lease
    try:
        wait_for(lease.is_leader, 3, message="never elected")

        def refuses(lease: Any) -> None:
            heard.append("started")
            raise RuntimeError("cannot start")

        with pytest.raises(RuntimeError, match="cannot start"):
            leases.join(
                "e",
                callbacks=Callbacks(
                    on_started=refuses, on_stopped=lambda lease: heard.append("stopped")
                ),
                health_check=lambda: "a member that failed to join is still asked",
            )
        # It heard "stopped" for its "started", and no longer takes part: its
        # health check is not asked, and the first member is the last to leave.
        assert heard == ["started", "stopped"]
        done = len(cycles)
        wait_for(lambda: len(cycles) >= done + 2, 3, message="no renewal after the join")
        assert lease.is_leader()
        first.leave()
        assert not lease.is_leader() and leases.elections() == []
    finally:
        leases.stop()


def test_callbacks_are_validated_when_built() -> None:
    with pytest.raises(TypeError, match=r"Callbacks\.on_started must be callable"):
        Callbacks(on_started="not a function")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callbacks must be a Callbacks"):
        lease_set(config()).join("e", callbacks={"on_started": print}, start=False)  # type: ignore[arg-type]


def test_members_bring_observers_and_one_brought_twice_hears_once() -> None:
    """What a lease reports to is what its members brought: nothing process-wide."""
    leases = lease_set(config())
    heard: list[tuple[str, str, int]] = []
    calls: list[str] = []
    shared = Observer(
        on_transition=lambda lease, event, epoch: heard.append(("shared", event, epoch)),
        on_store_call=lambda lease, operation, seconds, ok: calls.append(operation),
    )
    own = Observer(on_transition=lambda lease, event, epoch: heard.append(("own", event, epoch)))
    silent = leases.join("e", start=False)
    first = leases.join("e", observers=(shared,), start=False)
    second = leases.join("e", observers=(shared, own), start=False)
    try:
        first.lease.start()
        wait_for(first.lease.is_leader, 3, message="never elected")
        wait_for(lambda: len(heard) >= 2, 3, message="not told")
        # A member that left hears nothing more: the demotion reaches only `first`.
        second.leave()
        silent.leave()
        first.leave()
    finally:
        leases.stop()
    assert sorted(heard) == [
        ("own", "elected", 1),
        ("shared", "demoted", 1),
        ("shared", "elected", 1),
    ]
    assert calls and set(calls) <= {"acquire", "renew", "release"}, calls
    with pytest.raises(TypeError, match="observers must be Observer"):
        leases.join("e", observers=(print,), start=False)  # type: ignore[arg-type]


def test_leader_of_asks_the_store_without_joining() -> None:
    settings = config(leader_worker_election="e")
    assert leader_of(settings) is None, "nobody leads yet"
    leader = lease_set(config(leader_url=settings.url, leader_instance_id="two")).join("e")
    try:
        wait_for(leader.lease.is_leader, 3, message="never elected")
        holder = leader_of(settings)
        assert holder is not None and (holder.instance_id, holder.epoch) == ("two", 1)
        assert lease_set(settings).elections() == [], "asking joined nothing"
    finally:
        leader.owner.stop()


def test_the_old_import_paths_work_and_warn_once() -> None:
    code = (
        "import warnings\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    from celery_leader.lease import Lease\n"
        "    from celery_leader.callbacks import Callbacks, Observer\n"
        "    from celery_leader.lease import Lease as Again\n"
        "import celery_leader\n"
        "from celery_leader.election import events\n"
        "assert Lease is Again is celery_leader.Lease\n"
        "assert (Callbacks, Observer) == (events.Callbacks, events.Observer)\n"
        "print(sorted(str(w.message) for w in caught if w.category is DeprecationWarning))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(
        [
            "celery_leader.callbacks is deprecated: import from celery_leader.election.events",
            "celery_leader.lease is deprecated: import Lease from celery_leader",
        ]
    )
