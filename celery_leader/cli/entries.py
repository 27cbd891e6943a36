"""``leader entries add|ls|show|rm|pause|resume|run|import|export``, for both frameworks.

Both command lines parse their arguments and call :func:`run_command` with an
:class:`EntriesApp`. Exit codes: 0 done, 2 bad input, an unreachable store or a
refused edit (one line on stderr, nothing stored). ``run`` asks the leader for a
run (:mod:`~celery_leader.schedule.run_request`) and exits 0 when the leader sent
it, 2 when it would not (refused, expired, failed) and 3 while nobody answered
(queued) or the broker may or may not have it.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from ..backends import StoreFacets, open_store
from ..exceptions import ConfigError, StoreUnavailable
from ..ledger.summary import RECENT_RUNS, recent_run, summarize
from ..schedule import run_request
from ..schedule.audit import AuditRecord, audit_trail
from ..schedule.book import EntryBook
from ..schedule.entries import CODE, LIMITS, Entry, EntryError, allowed, instant_now
from ..schedule.run_request import DEFAULT_WAIT, QUEUED, SENT, UNKNOWN, RunResult
from ..schedule.series import Series
from ..schedule.state import parse_state, slot_name
from ..settings.config import LeaderConfig

Echo = Callable[[str], None]


@dataclass(frozen=True)
class CodeEntry:
    """A code entry (``beat_schedule``, ``leader_schedule``) as the entries commands show it."""

    task: str
    schedule: str
    series: Series | None
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EntriesApp:
    """What a framework gives the entries commands."""

    config: LeaderConfig
    code: Mapping[str, CodeEntry]
    #: Task (or actor) names this app knows; ``add`` warns about others.
    tasks: Collection[str]
    _: KW_ONLY
    #: The zone Celery crontabs are read in (redbeat's entries).
    zone: str = "UTC"
    #: Entry options this framework cannot honour, each with its reason: refused
    #: at every edit rather than silently dropped at send.
    refuses: Mapping[str, str] = field(default_factory=dict)


def check_options(app: EntriesApp, fields: Mapping[str, Any]) -> None:
    """Refuse an entry whose ``options`` this app cannot honour (one line)."""
    name = fields.get("name", "")
    for option in sorted(fields.get("options") or {}):
        if option in app.refuses:
            raise EntryError(f"entry {name}: option {option} refused: {app.refuses[option]}")


class EntriesError(Exception):
    """One line for stderr; exit code 2."""


@dataclass(frozen=True)
class _Session:
    """One command's app, store and output."""

    app: EntriesApp
    store: StoreFacets
    book: EntryBook
    echo: Echo


#: Changes of an entry ``show`` lists, newest first (as many as its recent runs).
RECENT_CHANGES = RECENT_RUNS


def _warn(line: str) -> None:
    print(f"Warning: {line}", file=sys.stderr)


def _store(
    app: EntriesApp, warn: Callable[[str], None] | None = None
) -> tuple[StoreFacets, EntryBook]:
    store = open_store(app.config)
    config = app.config
    book = EntryBook(
        store.entries,
        config.beat_election,
        set(app.code),
        journal=store.journal,
        keep=config.audit_keep,
        warn=warn,
    )
    return store, book


def run_command(app: EntriesApp, echo: Echo, command: str, **args: Any) -> int:
    """Run one entries command; bad input and store errors become :class:`EntriesError`.

    The changing commands take ``why`` and ``who`` (default: ``user@host``) for
    the audit trail; a trail that cannot be written is one warning line on stderr.
    """
    store, book = _store(app, _warn)
    try:
        return int(_COMMANDS[command](_Session(app, store, book, echo), **args))
    except (ConfigError, ValueError) as exc:
        raise EntriesError(str(exc).splitlines()[0]) from None
    except StoreUnavailable as exc:
        raise EntriesError(f"store {app.config.display_url} unreachable: {exc}") from None
    finally:
        store.close()


def add_fields(
    name: str,
    task: str,
    every: str | None = None,
    cron: str | None = None,
    tz: str | None = None,
    at: str | None = None,
    args: str | None = None,
    kwargs: str | None = None,
    queue: str | None = None,
    paused: bool = False,
    missed_slots: str | None = None,
    late_after: str | None = None,
    max_runtime: str | None = None,
) -> dict[str, Any]:
    """The fields of an entry from the ``add`` options (strings as typed)."""
    given = [k for k, v in (("--every", every), ("--cron", cron), ("--at", at)) if v is not None]
    if len(given) != 1:
        raise EntryError("give exactly one of --every SECONDS, --cron EXPR or --at ISO")
    if tz is not None and cron is None:
        raise EntryError("--tz goes with --cron")
    fields: dict[str, Any] = {"name": name, "task": task, "enabled": not paused}
    if every is not None:
        try:
            fields["every"] = float(every)
        except ValueError:
            raise EntryError(f"--every must be a number of seconds (got {every!r})") from None
        if fields["every"] <= 0:
            raise EntryError(f"--every must be above 0 seconds (got {every})")
    if cron is not None:
        fields["cron"], fields["tz"] = cron, tz or "UTC"
    if at is not None:
        fields["at"] = at
    fields["args"] = _json("--args", args, list, "a JSON array")
    fields["kwargs"] = _json("--kwargs", kwargs, dict, "a JSON object")
    options: dict[str, Any] = {}
    if queue is not None:
        options["queue"] = queue
    for option, text in (("late_after", late_after), ("max_runtime", max_runtime)):
        if text is not None:
            flag = f"--{option.replace('_', '-')}"
            try:
                options[option] = float(text)
            except ValueError:
                raise EntryError(f"{flag} must be a number of seconds (got {text!r})") from None
            if not options[option] > 0:
                raise EntryError(f"{flag} must be above 0 seconds (got {text})")
    if options:
        fields["options"] = options
    if missed_slots is not None:
        fields["missed_slots"] = missed_slots
    return fields


def _json(option: str, text: str | None, kind: type, what: str) -> Any:
    """``text`` read as JSON of ``kind`` (an empty one when not given)."""
    if text is None:
        return kind()
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise EntryError(f"{option} is not JSON ({exc}): {text!r:.60}") from None
    if not isinstance(value, kind):
        raise EntryError(f"{option} must be {what} (got {text!r:.60})")
    return value


# -- the commands -------------------------------------------------------------------


def _add(
    s: _Session,
    fields: dict[str, Any],
    replace: bool = False,
    strict: bool = False,
    why: str | None = None,
    who: str | None = None,
) -> int:
    task = fields["task"]
    if task not in s.app.tasks:
        if strict:
            raise EntryError(f"this app knows no task {task!r} (--strict)")
        print(f"Warning: this app knows no task {task!r}; adding it anyway", file=sys.stderr)
    if not allowed(task, s.app.config.entries_allow):
        print(
            f"Warning: task {task!r} is outside leader_entries_allow: the leader will not send it",
            file=sys.stderr,
        )
    if "at" in fields:
        at = Entry.from_json(json.dumps({"name": "x", "task": "x", "at": fields["at"]})).at
        if at is not None and at <= instant_now():
            raise EntryError(f"--at {fields['at']} is in the past")
    check_options(s.app, fields)
    entry = s.book.add(replace=replace, why=why, who=who, **fields)
    s.echo(f"{entry.name}: {entry.schedule_text} -> {entry.task} (version {entry.version})")
    return 0


def _rows(s: _Session) -> list[dict[str, Any]]:
    """One row per entry, code entries first."""
    stored = {e.name: e for e in s.book.list()}
    state = s.store.records.load(s.app.config.beat_election)
    now = instant_now()
    rows = []
    for name, code in sorted(s.app.code.items()):
        kept = stored.get(name)
        pause = kept if kept is not None and kept.kind == CODE else None
        rows.append(_row(name, "code", code.task, code.schedule, pause, code.series, state, now))
    for name, entry in sorted(stored.items()):
        if entry.kind != CODE:
            text, series = entry.schedule_text, entry.series()
            row = _row(name, "store", entry.task, text, entry, series, state, now)
            rows.append({**row, "version": entry.version})
    return rows


def _row(
    name: str,
    source: str,
    task: str,
    schedule: str,
    kept: Entry | None,
    series: Series | None,
    state: Mapping[str, str],
    now: datetime,
) -> dict[str, Any]:
    """``kept``: the store entry, or the kept pause of a code entry (``None``: none)."""
    recorded = parse_state(state[name]) if name in state else None
    last = None if recorded is None else recorded.last_run_at
    pause = kept if kept is not None and kept.paused_at(now) else None
    nxt = None
    if series is not None and (pause is None or pause.paused_until is not None):
        after = now
        if pause is not None and pause.paused_until is not None:
            # Due again from the pause's end: a slot due exactly then is sent.
            after = pause.paused_until - timedelta(microseconds=1)
        nxt = series.next_after(max(after, last) if last is not None else after)
    return {
        "name": name,
        "source": source,
        "task": task,
        "schedule": schedule,
        "enabled": pause is None,
        "paused_by": None if pause is None else pause.paused_by,
        "paused_why": None if pause is None else pause.paused_why,
        "paused_until": None if pause is None else _iso(pause.paused_until),
        "next_due": None if nxt is None else nxt.isoformat(),
        "last_slot": None if last is None else slot_name(name, last),
    }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _ls(s: _Session, as_json: bool = False) -> int:
    rows = _rows(s)
    if as_json:
        s.echo(json.dumps(rows, indent=2))
        return 0
    header = ("NAME", "SOURCE", "SCHEDULE", "ENABLED", "NEXT DUE", "LAST SLOT SENT", "PAUSE")
    table = [header] + [
        (
            r["name"],
            r["source"],
            r["schedule"],
            "yes" if r["enabled"] else "paused",
            r["next_due"] or "-",
            r["last_slot"] or "-",
            pause_text(r),
        )
        for r in rows
    ]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for row in table:
        s.echo("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def pause_text(row: Mapping[str, Any]) -> str:
    """A row's pause in words: ``until <time> by <who>: <why>`` (``-``: not paused)."""
    if row["enabled"]:
        return "-"
    until = row["paused_until"]
    text = f"until {until}" if until else "until resumed"
    if row["paused_by"]:
        text += f" by {row['paused_by']}"
    return f"{text}: {row['paused_why']}" if row["paused_why"] else text


def _show(s: _Session, name: str, as_json: bool = False) -> int:
    rows = {r["name"]: r for r in _rows(s)}
    if name not in rows:
        raise EntryError(f"no entry {name} (neither in the code nor in the store)")
    entry = s.book.get(name)
    shown = dict(rows[name])
    code = s.app.code.get(name)
    options = code.options if code is not None else {} if entry is None else entry.options
    shown.update({limit: options.get(limit) for limit in LIMITS})
    if entry is not None and entry.kind != CODE:
        shown["entry"] = json.loads(entry.to_json())
    if s.app.config.ledger:
        election = s.app.config.beat_election
        summaries = [r for r in s.store.runs.summaries(election) if r.entry == name]
        runs = summarize(summaries, time.time())
        # null: the ledger has no run of it within its retention.
        shown["runs"] = runs[0].to_json() if runs else None
        recent = s.store.runs.runs_of(election, name, RECENT_RUNS)
        shown["recent_runs"] = [recent_run(key, text) for key, text in sorted(recent, reverse=True)]
    trail = audit_trail(s.store.journal, s.app.config.beat_election, RECENT_CHANGES, entry=name)
    shown["recent_changes"] = [
        {**asdict(record), "at": _iso(datetime.fromtimestamp(record.at, timezone.utc))}
        for _, record in trail
    ]
    if as_json:
        s.echo(json.dumps(shown, indent=2))
    else:
        for key, value in shown.items():
            s.echo(f"{key}: {json.dumps(value) if isinstance(value, dict | list) else value}")
    return 0


def _edit(verb: str, done: str) -> Callable[..., int]:
    """``rm`` (``remove``) or ``resume`` entry ``name``, then say it is ``done``."""

    def command(s: _Session, name: str, why: str | None = None, who: str | None = None) -> int:
        if verb != "remove" and name not in s.app.code and s.book.get(name) is None:
            raise EntryError(f"no entry {name} (neither in the code nor in the store)")
        getattr(s.book, verb)(name, why=why, who=who)
        s.echo(f"{name}: {done}")
        return 0

    return command


def _pause(
    s: _Session,
    name: str,
    why: str | None = None,
    until: str | None = None,
    who: str | None = None,
) -> int:
    if name not in s.app.code and s.book.get(name) is None:
        raise EntryError(f"no entry {name} (neither in the code nor in the store)")
    entry = s.book.pause(name, why=why, until=until, who=who)
    end = entry.paused_until
    s.echo(f"{name}: paused" + ("" if end is None else f" until {end.isoformat()}"))
    return 0


def _run(
    s: _Session,
    name: str,
    key: str | None = None,
    wait: float = DEFAULT_WAIT,
    why: str | None = None,
    as_json: bool = False,
    who: str | None = None,
) -> int:
    result, waited = _ask_run(s, name, key, wait, who, why)
    if as_json:
        s.echo(json.dumps(result.to_json(), indent=2))
    else:
        s.echo(result.text(waited))
    state = result.state
    return 0 if state == SENT else 3 if state in (QUEUED, UNKNOWN) else 2


def _ask_run(
    s: _Session,
    name: str,
    key: str | None,
    wait: float,
    who: str | None,
    why: str | None,
) -> tuple[RunResult, float]:
    """Ask the leader for one run of ``name`` now and wait up to ``wait`` seconds for
    its outcome; the result and the seconds waited. A new request is kept in the
    audit trail."""
    if wait < 0:
        raise EntryError(f"--wait must be 0 seconds or more (got {wait:g})")
    if name not in s.app.code:
        entry = s.book.get(name)
        if entry is None or entry.kind == CODE:
            raise EntryError(f"no entry {name} (neither in the code nor in the store)")
        if not allowed(entry.task, s.app.config.entries_allow):
            raise EntryError(f"task {entry.task} is outside leader_entries_allow")
    election = s.app.config.beat_election
    entries = s.store.entries
    asked = run_request.new_request(name, key, who or s.book.actor, why, time.time())
    since = entries.version(election)
    request, repeated = run_request.submit(entries, election, asked)
    started = time.monotonic()
    request = run_request.await_outcome(entries, election, request, since, wait)
    result = RunResult(request, repeated)
    if not repeated:
        details = {k: v for k, v in result.to_json().items() if k in ("key", "state", "slot")}
        s.book.record(name, "run", why, who, details)
    return result, time.monotonic() - started


def _export(s: _Session, as_json: bool = False) -> int:
    entries = [json.loads(e.to_json()) for e in s.book.list() if e.kind != CODE]
    if as_json:
        s.echo(json.dumps(entries, indent=2))
    else:
        for entry in entries:
            s.echo(json.dumps(entry, sort_keys=True))
    return 0


def _import(
    s: _Session,
    lines: Iterable[str],
    replace: bool = False,
    why: str | None = None,
    who: str | None = None,
) -> int:
    """Entries from JSON lines (what ``export`` prints); all are checked before any is stored."""
    entries = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError as exc:
            raise EntryError(f"line {number} is not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise EntryError(f"line {number} is not a JSON object")
        fields = {
            k: v for k, v in data.items() if k not in ("version", "generation", "active_since")
        }
        try:
            Entry.from_json(json.dumps(fields))
        except EntryError as exc:
            raise EntryError(f"line {number}: {exc}") from None
        entries.append(fields)
    return _add_all(s, entries, replace, why, who)


def _add_all(
    s: _Session,
    entries: list[dict[str, Any]],
    replace: bool,
    why: str | None = None,
    who: str | None = None,
) -> int:
    for fields in entries:
        check_options(s.app, fields)
    names = [e["name"] for e in entries]
    if len(set(names)) != len(names):
        raise EntryError("two entries have the same name")
    existing = {e.name for e in s.book.list()}
    clash = sorted((set(names) & existing) if not replace else set())
    clash += sorted(set(names) & s.book.code)
    if clash:
        raise EntryError(f"entries exist already: {', '.join(clash)} (use --replace)")
    for fields in entries:
        entry = s.book.add(replace=replace, why=why, who=who, imported=True, **fields)
        s.echo(f"{entry.name}: {entry.schedule_text} -> {entry.task}")
    s.echo(f"{len(entries)} entries imported")
    return 0


def _from_redbeat(
    s: _Session,
    url: str,
    prefix: str = "redbeat",
    dry_run: bool = False,
    replace: bool = False,
    why: str | None = None,
    who: str | None = None,
) -> int:
    entries = redbeat_entries(url, prefix, s.app.zone)
    if not dry_run:
        return _add_all(s, entries, replace, why, who)
    for fields in entries:
        check_options(s.app, fields)
    for fields in entries:
        s.echo(json.dumps(fields, sort_keys=True))
    s.echo(f"{len(entries)} entries would be imported (--dry-run: nothing stored)")
    return 0


def redbeat_entries(url: str, prefix: str, zone: str) -> list[dict[str, Any]]:
    """redbeat's stored entries as entry fields; the entries its ``beat_schedule``
    declared (statics) are code, not data, and are left out. Solar and rrule
    schedules have no equal here and are refused."""
    # The Redis client is imported only here: the other commands need no extra.
    redbeat = importlib.import_module("celery_leader.backends.redis.redbeat")
    statics, definitions = redbeat.read_redbeat(url, prefix, 10.0)
    out = []
    for name, text in definitions:
        if name in statics:
            continue
        try:
            data = json.loads(text)
        except ValueError:
            raise EntryError(f"redbeat entry {name}: its definition is not JSON") from None
        out.append(_from_definition(name, data, zone))
    return out


def _from_definition(name: str, data: Mapping[str, Any], zone: str) -> dict[str, Any]:
    schedule = data.get("schedule") or {}
    kind = schedule.get("__type__")
    fields: dict[str, Any] = {
        "name": name,
        "task": data.get("task"),
        "args": list(data.get("args") or []),
        "kwargs": dict(data.get("kwargs") or {}),
        "enabled": bool(data.get("enabled", True)),
    }
    options = {k: v for k, v in (data.get("options") or {}).items() if k in ("queue", "priority")}
    if options:
        fields["options"] = options
    if kind == "interval":
        fields["every"] = float(schedule["every"])
    elif kind == "crontab":
        parts = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
        fields["cron"] = " ".join(str(schedule[p]).replace(" ", "") for p in parts)
        fields["tz"] = zone
    else:
        raise EntryError(f"redbeat entry {name}: a {kind} schedule has no equal here")
    return fields


_COMMANDS: dict[str, Callable[..., int]] = {
    "add": _add,
    "ls": _ls,
    "show": _show,
    "rm": _edit("remove", "removed"),
    "pause": _pause,
    "resume": _edit("resume", "resumed"),
    "run": _run,
    "export": _export,
    "import": _import,
    "from-redbeat": _from_redbeat,
}


class ScheduleEntries:
    """The Python API of the entries kept in the store (the CLI's commands, typed); built by
    ``entries_of``, closed by :meth:`close` or as a context manager. Bad input raises
    ``EntryError`` (a ``ConfigError``), a version that moved ``EntryConflict``.

    Every change is kept in the audit trail with ``why`` and ``who`` (default: ``user@host``
    of this process); a trail that cannot be written is a logged warning, the change made.
    """

    def __init__(self, app: EntriesApp) -> None:
        self.app = app
        self._store, self.book = _store(app)

    def add(
        self,
        name: str,
        task: str,
        *,
        replace: bool = False,
        why: str | None = None,
        who: str | None = None,
        **fields: Any,
    ) -> Entry:
        """Add entry ``name`` sending ``task``: exactly one of ``every`` (seconds),
        ``cron`` (with ``tz``) or ``at`` (a datetime), and any other
        :class:`~celery_leader.schedule.entries.Entry` field."""
        check_options(self.app, {"name": name, **fields})
        return self.book.add(replace=replace, why=why, who=who, name=name, task=task, **fields)

    def update(
        self,
        name: str,
        expected_version: int | None = None,
        *,
        why: str | None = None,
        who: str | None = None,
        **changes: Any,
    ) -> Entry:
        """Change fields of ``name``; with ``expected_version``, only if nobody else did."""
        check_options(self.app, {"name": name, **changes})
        return self.book.update(name, expected_version, why=why, who=who, **changes)

    def remove(
        self,
        name: str,
        expected_version: int | None = None,
        *,
        why: str | None = None,
        who: str | None = None,
    ) -> Entry:
        """Remove store entry ``name`` (a code entry cannot be removed: pause it)."""
        return self.book.remove(name, expected_version, why=why, who=who)

    def pause(
        self,
        name: str,
        why: str | None = None,
        until: datetime | str | None = None,
        *,
        who: str | None = None,
    ) -> Entry:
        """Stop sending ``name`` (store or code entry) until :meth:`resume`, or until
        ``until`` (a datetime, naive meaning UTC, or ISO 8601), when it runs again by
        itself; the entry keeps who paused it, why and until when."""
        return self.book.pause(name, why, until, who=who)

    def resume(self, name: str, why: str | None = None, *, who: str | None = None) -> Entry:
        """Send ``name`` again from now; nothing for the paused time."""
        return self.book.resume(name, why, who=who)

    def run_now(
        self,
        name: str,
        *,
        key: str | None = None,
        wait: float = DEFAULT_WAIT,
        who: str | None = None,
        why: str | None = None,
    ) -> RunResult:
        """Ask the leader for one run of ``name`` now, outside its grid, and wait up to
        ``wait`` seconds for its outcome (``result.state``: ``sent`` with its
        ``slot`` and ``epoch``, ``queued`` while no leader answered, or why not).

        ``key``: the idempotency key (default: a new one); a request made again with
        a key used within the last hour is answered with the first one's outcome.
        ``who`` (default ``user@host``) and ``why`` go to the audit trail.
        """
        session = _Session(self.app, self._store, self.book, lambda line: None)
        return _ask_run(session, name, key, wait, who, why)[0]

    def changes(self, name: str | None = None, limit: int = RECENT_CHANGES) -> list[AuditRecord]:
        """The newest ``limit`` changes of entry ``name`` (of every entry: ``None``),
        newest first."""
        trail = audit_trail(self._store.journal, self.app.config.beat_election, limit, name)
        return [record for _, record in trail]

    def get(self, name: str) -> Entry | None:
        """Store entry (or kept pause of code entry) ``name``, or ``None``."""
        return self.book.get(name)

    def list(self) -> list[Entry]:
        """Every store entry and kept pause, by name."""
        return self.book.list()

    def close(self) -> None:
        """Close the store connection."""
        self._store.close()

    def __enter__(self) -> ScheduleEntries:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
