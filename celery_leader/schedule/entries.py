"""A schedule entry kept in the store: its fields, their checks, its JSON and its series.

Framework-free (``task`` is a Celery task or a Dramatiq actor name); the store only
holds the JSON of :meth:`Entry.to_json` (never a pickle), at most :data:`MAX_ENTRY_BYTES`.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import math
import re
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..exceptions import ConfigError
from ..settings.config import MISSED_SLOTS, validate_grace
from .series import CronSeries, Every, Series, utc

#: The longest JSON an entry may have in the store (args and kwargs included).
MAX_ENTRY_BYTES = 16 * 1024

#: The record kinds in the store: a whole entry, or the pause of a code entry.
STORE, CODE = "store", "code"

_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,190}$")
#: Options that change nothing in dispatch (seconds): how long after its due time
#: a slot may wait to start, and run, before the console calls it late or overrun.
LIMITS = ("late_after", "max_runtime")
_OPTIONS = ("queue", "priority", "expires", "headers", *LIMITS)
#: The longest reason (and author) a pause keeps.
MAX_WHY = 500
_PAUSE_FIELDS = frozenset({"paused_by", "paused_why", "paused_until"})
#: The empty arguments and options every entry without them shares.
_NO_ARGS: list[Any] = []
_NO_KWARGS: dict[str, Any] = {}
_NO_OPTIONS: dict[str, Any] = {}


class EntryError(ConfigError):
    """An entry (or an edit of one) that cannot be kept: one line saying why."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One schedule entry kept in the store (``kind`` ``"store"``), or the kept
    pause of a code entry (``kind`` ``"code"``: only ``enabled`` and the edit
    fields count)."""

    name: str
    task: str = ""
    every: float | None = None
    cron: str | None = None
    tz: str = "UTC"
    at: datetime | None = None
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: ``queue``, ``priority``, ``expires`` (seconds), ``headers`` (a JSON object),
    #: and the :data:`LIMITS` (seconds), which only the console reads.
    options: dict[str, Any] = field(default_factory=dict)
    enabled: bool = True
    #: While paused: who paused it, why, and when it runs again by itself (aware
    #: UTC; ``None``: when resumed).
    paused_by: str | None = None
    paused_why: str | None = None
    paused_until: datetime | None = None
    start_at: datetime | None = None
    end_at: datetime | None = None
    #: Its own missed-slot policy and grace (``None``: the settings').
    missed_slots: str | None = None
    missed_slots_grace: float | None = None
    kind: str = STORE
    #: Moved by every edit: an update may name the version it read.
    version: int = 1
    #: One lifetime of the entry: made at add, kept by edits, new on re-create.
    generation: str = ""
    #: Since when it has been enabled with its current schedule (aware UTC).
    active_since: datetime | None = None

    def paused_at(self, now: datetime) -> bool:
        """Whether it is paused at ``now``: a pause with an end runs out by itself."""
        return not self.enabled and (self.paused_until is None or now < self.paused_until)

    def running_since(self, now: datetime) -> datetime | None:
        """Since when it has been enabled as of ``now`` (its ``active_since``, or the
        end of a pause that ran out): no slot due before it is sent."""
        if self.enabled or self.paused_until is None or now < self.paused_until:
            return self.active_since
        if self.active_since is None:
            return self.paused_until
        return max(self.active_since, self.paused_until)

    def settled(self, now: datetime) -> Entry:
        """This entry with a pause that ran out by ``now`` written as resumed at its end
        (what an edit starts from; unchanged otherwise)."""
        if self.enabled or self.paused_at(now):
            return self
        return replace(
            self,
            enabled=True,
            active_since=self.running_since(now),
            paused_by=None,
            paused_why=None,
            paused_until=None,
        )

    @property
    def schedule_text(self) -> str:
        """The schedule in the CLI's words: ``every 30s``, ``cron "0 * * * *" UTC``, ``at ...``."""
        if self.kind == CODE:
            return "(code)"
        if self.every is not None:
            return f"every {self.every:g}s"
        if self.cron is not None:
            return f'cron "{self.cron}" {self.tz}'
        assert self.at is not None
        return f"at {self.at.isoformat()}"

    def series(self) -> Series:
        """Its due instants (UTC), within ``start_at`` / ``end_at``."""
        base: Series
        if self.every is not None:
            base = Every(timedelta(microseconds=round(self.every * 1_000_000)))
        elif self.cron is not None:
            base = parse_cron(self.cron, _zone(self.tz))
        else:
            assert self.at is not None
            base = Once(self.at)
        if self.start_at is None and self.end_at is None:
            return base
        return Bounded(base, self.start_at, self.end_at)

    def to_json(self) -> str:
        """The stored form: JSON, keys sorted, instants in ISO 8601 UTC."""
        # Not asdict(): it deep-copies args, kwargs and options, which json.dumps only
        # reads (seconds when a leader reads 100,000 entries).
        data = {k: v for k, v in _plain(self).items() if v is not None}
        for key in ("at", "start_at", "end_at", "active_since", "paused_until"):
            if key in data:
                data[key] = utc(data[key]).isoformat()
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Entry:
        """Read a stored entry; :class:`EntryError` when it is not one."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise EntryError(f"not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise EntryError("not a JSON object")
        # The stored text's own size: writing the entry out again only to measure
        # it was a third of a leader's time reading a million entries.
        return checked(data, len(text.encode()))

    def edited(self, now: datetime, **changes: Any) -> Entry:
        """This entry with ``changes``, its version moved; ``active_since`` moves to
        ``now`` when it is (re-)enabled or its schedule changes. A pause that ran out
        counts as resumed at its end; an enabled entry keeps no pause."""
        base = self.settled(utc(now))
        new = replace(base, **changes)
        schedule_moved = any(
            getattr(new, k) != getattr(base, k)
            for k in ("every", "cron", "tz", "at", "start_at", "end_at")
        )
        resumed = new.enabled and not base.enabled
        since = utc(now) if (schedule_moved or resumed) else base.active_since
        if new.enabled:
            new = replace(new, paused_by=None, paused_why=None, paused_until=None)
        return checked({**_plain(new), "version": base.version + 1, "active_since": since})


def new_entry(now: datetime, **fields: Any) -> Entry:
    """A checked entry from ``fields`` (as the CLI and API give them): a new
    generation, active since ``now``."""
    return checked(
        {**fields, "version": 1, "generation": uuid.uuid4().hex, "active_since": utc(now)}
    )


def code_pause(
    name: str, now: datetime, enabled: bool, previous: Entry | None, **pause: Any
) -> Entry:
    """The stored pause (or resume) of code entry ``name``; ``pause``: its
    ``paused_by``, ``paused_why`` and ``paused_until``."""
    if previous is None:
        fresh = {"name": name, "kind": CODE, "enabled": enabled, "generation": uuid.uuid4().hex}
        return checked({**fresh, "active_since": utc(now), **pause})
    return previous.edited(now, enabled=enabled, **pause)


def checked(data: Mapping[str, Any], size: int | None = None) -> Entry:
    """An :class:`Entry` from plain values; :class:`EntryError` (one line) when any is bad.
    ``size``: the bytes of the JSON the values were read from (else of its stored form)."""
    unknown = data.keys() - _ENTRY_FIELDS
    if unknown:
        raise EntryError(f"unknown entry field(s): {', '.join(sorted(unknown))}")
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise EntryError(f"an entry name is 1-190 letters, digits and _ . : - (got {name!r})")
    kind = data.get("kind", STORE)
    if kind not in (STORE, CODE):
        raise EntryError(f"entry {name}: kind must be {STORE} or {CODE} (got {kind!r})")
    values: dict[str, Any] = {"name": name, "kind": STORE if kind == STORE else CODE}
    values["enabled"] = _flag(name, "enabled", data.get("enabled", True))
    values["version"] = _version(name, data.get("version", 1))
    generation = data.get("generation", "")
    if not isinstance(generation, str):
        raise EntryError(f"entry {name}: generation must be a string")
    values["generation"] = generation
    values["active_since"] = _instant(name, "active_since", data.get("active_since"))
    if _PAUSE_FIELDS & data.keys():  # most entries were never paused: skip the checks
        values.update(_pause_fields(name, data, values["enabled"]))
    if kind == STORE:
        values.update(_schedule_fields(name, data))
    entry = Entry(**values)
    if size is None:
        size = len(entry.to_json().encode())
    if size > MAX_ENTRY_BYTES:
        raise EntryError(
            f"entry {name} is {size} bytes of JSON, more than the limit of {MAX_ENTRY_BYTES}"
        )
    return entry


#: The fields of an entry, and those whose checks :func:`_schedule_fields` remembers.
_ENTRY_FIELDS = frozenset(Entry.__dataclass_fields__)
_SCHEDULE = (
    "task", "every", "cron", "tz", "at", "start_at", "end_at", "missed_slots",
    "missed_slots_grace",
)  # fmt: skip
#: Schedules checked and found good, by their values (and types): the entries of a
#: large schedule share a few, and checking each again was most of reading it.
_GOOD: dict[tuple[object, ...], dict[str, Any]] = {}
_GOOD_KEPT = 4096


def _schedule_fields(name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    options = data.get("options") or {}
    try:
        values = [data.get(k) for k in _SCHEDULE]
        shown = json.dumps(options, sort_keys=True) if options else None
        key: tuple[object, ...] | None = (*((type(v), v) for v in values), shown)
        good = _GOOD.get(key)  # type: ignore[arg-type]
    except TypeError:  # an unhashable value: checked below, and refused
        key, good = None, None
    if good is None:
        good = _checked_schedule(name, data)
        if key is not None:
            if len(_GOOD) >= _GOOD_KEPT:
                _GOOD.clear()
            _GOOD[key] = good
    args, kwargs = data.get("args", []), data.get("kwargs", {})
    if not isinstance(args, list):
        raise EntryError(f"entry {name}: args must be a JSON array (got {args!r:.60})")
    if not isinstance(kwargs, dict):
        raise EntryError(f"entry {name}: kwargs must be a JSON object (got {kwargs!r:.60})")
    # Never changed in place (an Entry is a value): the empty ones are shared.
    return {**good, "args": args or _NO_ARGS, "kwargs": kwargs or _NO_KWARGS}


def _checked_schedule(name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """The schedule fields of ``data`` (all but args and kwargs), checked."""
    task = data.get("task")
    if not isinstance(task, str) or not task.strip():
        raise EntryError(f"entry {name}: a task (or actor) name is needed")
    # Interned, as are instants read (see _parse_instant) and empty arguments: a large
    # schedule repeats a few tasks, zones and times, and an entry is held per name.
    out: dict[str, Any] = {"task": sys.intern(task)}
    given = [k for k in ("every", "cron", "at") if data.get(k) is not None]
    if len(given) != 1:
        raise EntryError(f"entry {name}: give exactly one of every, cron or at (got {given})")
    tz = data.get("tz", "UTC")
    if not isinstance(tz, str):
        raise EntryError(f"entry {name}: tz must be an IANA time zone name (got {tz!r})")
    out["tz"] = sys.intern(tz)
    if "every" in given:
        out["every"] = _seconds(name, data["every"])
    elif "cron" in given:
        cron = data["cron"]
        if not isinstance(cron, str):
            raise EntryError(f"entry {name}: cron must be a string (got {cron!r})")
        parse_cron(cron, _zone(tz, name))
        out["cron"] = sys.intern(" ".join(cron.split()))
    else:
        out["at"] = _instant(name, "at", data["at"])
    if "cron" not in given and tz != "UTC":
        _zone(tz, name)
    out["options"] = _options(name, data.get("options", {})) or _NO_OPTIONS
    out["start_at"] = _instant(name, "start_at", data.get("start_at"))
    out["end_at"] = _instant(name, "end_at", data.get("end_at"))
    if out["start_at"] and out["end_at"] and out["end_at"] <= out["start_at"]:
        raise EntryError(f"entry {name}: end_at must come after start_at")
    policy = data.get("missed_slots")
    if policy is not None and policy not in MISSED_SLOTS:
        raise EntryError(
            f"entry {name}: missed_slots must be one of {', '.join(MISSED_SLOTS)} (got {policy!r})"
        )
    out["missed_slots"] = None if policy is None else sys.intern(policy)
    try:
        out["missed_slots_grace"] = validate_grace(
            f"entry {name}: missed_slots_grace", data.get("missed_slots_grace")
        )
    except ConfigError as exc:
        raise EntryError(str(exc)) from None
    return out


def _pause_fields(name: str, data: Mapping[str, Any], enabled: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("paused_by", "paused_why"):
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise EntryError(f"entry {name}: {key} must be a string (got {value!r:.60})")
        if value is not None and len(value) > MAX_WHY:
            raise EntryError(f"entry {name}: {key} is longer than {MAX_WHY} characters")
        out[key] = value
    out["paused_until"] = _instant(name, "paused_until", data.get("paused_until"))
    if enabled and any(v is not None for v in out.values()):
        raise EntryError(f"entry {name}: only a paused entry has paused_by, _why or _until")
    return out


def pause_end(name: str, value: object, now: datetime) -> datetime | None:
    """When a pause of entry ``name`` given ``until`` ``value`` (an ISO 8601 string
    or a datetime; naive means UTC) ends: after ``now``, or :class:`EntryError`."""
    until = _instant(name, "until", value)
    if until is not None and until <= now:
        raise EntryError(f"entry {name}: until {until.isoformat()} is not in the future")
    return until


def check_limit(what: str, value: object) -> float | None:
    """A :data:`LIMITS` option's value: seconds above 0, or ``None`` (not set)."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise EntryError(f"{what} must be seconds above 0 (got {value!r:.60})")
    return float(value)


def _plain(entry: Entry) -> dict[str, Any]:
    return {k: getattr(entry, k) for k in Entry.__dataclass_fields__}


def _flag(name: str, key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise EntryError(f"entry {name}: {key} must be true or false (got {value!r})")
    return value


def _version(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EntryError(f"entry {name}: version must be a whole number >= 1 (got {value!r})")
    return value


def _seconds(name: str, value: object) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EntryError(f"entry {name}: every must be a number of seconds (got {value!r})")
    if not math.isfinite(value) or value < 0.001:
        raise EntryError(f"entry {name}: every must be at least 0.001 seconds (got {value!r})")
    return float(value)


def _instant(name: str, key: str, value: object) -> datetime | None:
    """An aware instant from an ISO 8601 string (or datetime); naive means UTC."""
    if value is None:
        return None
    if isinstance(value, str):
        parsed = _parse_instant(value)
        if parsed is None:
            raise EntryError(f"entry {name}: {key} must be an ISO 8601 time (got {value!r})")
        return parsed
    if not isinstance(value, datetime):
        raise EntryError(f"entry {name}: {key} must be an ISO 8601 time (got {value!r})")
    return utc(value)


@functools.lru_cache(maxsize=4096)
def _parse_instant(text: str) -> datetime | None:
    """An aware UTC instant from ISO 8601 (``None``: not one); cached, so the entries of
    a large schedule, most stamped alike, share their instants."""
    try:
        return utc(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        return None


def _options(name: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise EntryError(f"entry {name}: options must be a JSON object")
    unknown = set(value) - set(_OPTIONS)
    if unknown:
        raise EntryError(
            f"entry {name}: unknown option(s) {', '.join(sorted(unknown))} "
            f"(known: {', '.join(_OPTIONS)})"
        )
    queue, priority = value.get("queue"), value.get("priority")
    expires, headers = value.get("expires"), value.get("headers")
    if queue is not None and (not isinstance(queue, str) or not queue):
        raise EntryError(f"entry {name}: queue must be a queue name (got {queue!r})")
    if priority is not None and (
        isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 255
    ):
        raise EntryError(f"entry {name}: priority must be a whole number 0-255 (got {priority!r})")
    if expires is not None and (
        isinstance(expires, bool) or not isinstance(expires, int | float) or expires <= 0
    ):
        raise EntryError(f"entry {name}: expires must be seconds above 0 (got {expires!r})")
    if headers is not None and not isinstance(headers, dict):
        raise EntryError(f"entry {name}: headers must be a JSON object (got {headers!r:.60})")
    for limit in LIMITS:
        check_limit(f"entry {name}: option {limit}", value.get(limit))
    return {k: v for k, v in value.items() if v is not None}


def _zone(tz: str, name: str = "") -> ZoneInfo:
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        where = f"entry {name}: " if name else ""
        raise EntryError(
            f"{where}unknown time zone {tz!r} (an IANA name, like Europe/Paris)"
        ) from None


class Once(Series):
    """A single run at ``at``."""

    def __init__(self, at: datetime) -> None:
        self.at = utc(at)

    def next_after(self, moment: datetime) -> datetime | None:
        return self.at if self.at > utc(moment) else None

    def key(self) -> tuple[object, ...]:
        return ("once", self.at)

    def __repr__(self) -> str:
        return f"Once({self.at.isoformat()})"


class Bounded(Series):
    """The slots of ``inner`` from ``start`` (inclusive) to ``end`` (inclusive)."""

    def __init__(self, inner: Series, start: datetime | None, end: datetime | None) -> None:
        self.inner, self.start, self.end = inner, start, end

    def next_after(self, moment: datetime) -> datetime | None:
        if self.start is not None and moment < self.start:
            moment = self.start - timedelta(microseconds=1)
        due = self.inner.next_after(moment)
        if due is None or (self.end is not None and due > self.end):
            return None
        return due

    def anchor(self, now: datetime) -> datetime:
        return self.inner.anchor(now)

    def spacing(self) -> float:
        return self.inner.spacing()

    def key(self) -> tuple[object, ...]:
        return ("bounded", self.inner.key(), self.start, self.end)

    def __repr__(self) -> str:
        return f"Bounded({self.inner!r}, {self.start}, {self.end})"


_MONTHS = "jan feb mar apr may jun jul aug sep oct nov dec".split()
_DAYS = "sun mon tue wed thu fri sat".split()
#: (low, high, names) of the five fields: minute, hour, day of month, month, day of week.
_FIELDS = ((0, 59, None), (0, 23, None), (1, 31, None), (1, 12, _MONTHS), (0, 7, _DAYS))
_FIELD_NAMES = ("minute", "hour", "day of month", "month", "day of week")


# Cached: a large schedule repeats a few expressions, and a leader reads every entry
# after an edit. A CronSeries is never changed once made, so entries may share one.
@functools.lru_cache(maxsize=1024)
def parse_cron(expression: str, zone: ZoneInfo) -> CronSeries:
    """A 5-field cron expression as a :class:`CronSeries` read in ``zone``.

    A day must match both its day of month and its weekday (Celery's rule), so an
    expression that restricts both is refused rather than read differently from cron.
    """
    fields = expression.split()
    if len(fields) != 5:
        raise EntryError(
            f"cron {expression!r} must have 5 fields (minute hour day-of-month month "
            f"day-of-week), got {len(fields)}"
        )
    sets = [
        _cron_field(text, low, high, names, what, expression)
        for text, (low, high, names), what in zip(fields, _FIELDS, _FIELD_NAMES, strict=True)
    ]
    if fields[2] != "*" and fields[4] != "*":
        raise EntryError(
            f"cron {expression!r} restricts both day of month and day of week; cron would "
            "run on either, celery-leader on both: use two entries"
        )
    return CronSeries(zone, sets[0], sets[1], sets[2], sets[3], {d % 7 for d in sets[4]})


def _cron_field(
    text: str, low: int, high: int, names: list[str] | None, what: str, expression: str
) -> set[int]:
    def bad(why: str) -> EntryError:
        return EntryError(f"cron {expression!r}: {what} field {text!r} {why}")

    def number(token: str) -> int:
        if names is not None and token.lower() in names:
            return names.index(token.lower()) + (1 if names is _MONTHS else 0)
        if not token.isdigit():
            raise bad(f"has {token!r}, not a number")
        value = int(token)
        if not low <= value <= high:
            raise bad(f"has {value}, outside {low}-{high}")
        return value

    values: set[int] = set()
    for part in text.split(","):
        body, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise bad(f"has step {step_text!r}, not a whole number above 0")
            step = int(step_text)
        if body == "*":
            start, stop = low, high
        elif "-" in body:
            first, _, last = body.partition("-")
            start, stop = number(first), number(last)
            if stop < start:
                raise bad(f"has a range {body!r} that runs backwards")
        else:
            start = number(body)
            stop = high if step_text else start
        values.update(range(start, stop + 1, step))
    return values


def instant_now() -> datetime:
    """The wall-clock now, aware UTC (what edits stamp ``active_since`` with)."""
    return datetime.now(timezone.utc)


def allowed(task: str, globs: tuple[str, ...]) -> bool:
    """Whether ``task`` matches one of the ``leader_entries_allow`` globs."""
    return any(fnmatch.fnmatchcase(task, glob) for glob in globs)
