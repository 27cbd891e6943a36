"""redbeat's scheduler, unchanged except that each message names the slot it fulfils.

Kept out of ``bench_app`` because importing redbeat connects its lock handler to
``beat_init`` for every scheduler in the process, not only its own.
"""

from redbeat import RedBeatScheduler


class SlotRedBeatScheduler(RedBeatScheduler):
    """The slot is the entry plus the ``last_run_at`` it was due after, as read from
    redbeat's shared schedule in Redis: two beats sending the same run of an entry
    send the same slot."""

    def apply_async(self, entry, producer=None, advance=True, **kwargs):
        last = entry.last_run_at.isoformat() if entry.last_run_at else "never"
        headers = {**entry.options.get("headers", {}), "bench_slot": f"{entry.name}@{last}"}
        entry.options = {**entry.options, "headers": headers}
        return super().apply_async(entry, producer, advance, **kwargs)
