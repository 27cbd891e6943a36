"""django-celery-beat's ``DatabaseScheduler``, unchanged except that each message
names the slot it fulfils (``bench_slot``: the entry and the ``last_run_at`` it
was due after), as ``redbeat_slots`` does for redbeat."""

from django_celery_beat.schedulers import DatabaseScheduler


class SlotDatabaseScheduler(DatabaseScheduler):
    """Stamps ``bench_slot`` on every message, so the benchmark can tell how late it was."""

    def apply_async(self, entry, producer=None, advance=True, **kwargs):
        last = entry.last_run_at.isoformat() if entry.last_run_at else "never"
        headers = {**entry.options.get("headers", {}), "bench_slot": f"{entry.name}@{last}"}
        entry.options = {**entry.options, "headers": headers}
        return super().apply_async(entry, producer, advance, **kwargs)
