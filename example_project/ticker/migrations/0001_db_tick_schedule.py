"""Put one periodic task in django-celery-beat's tables: ``db_tick`` every 5 s."""

from typing import ClassVar

from django.db import migrations


def create(apps, schema_editor):
    interval_model = apps.get_model("django_celery_beat", "IntervalSchedule")
    task_model = apps.get_model("django_celery_beat", "PeriodicTask")
    every, _ = interval_model.objects.get_or_create(every=5, period="seconds")
    task_model.objects.get_or_create(
        name="db_tick every 5 s", defaults={"task": "ticker.tasks.db_tick", "interval": every}
    )


def remove(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(
        name="db_tick every 5 s"
    ).delete()


class Migration(migrations.Migration):
    dependencies: ClassVar = [("django_celery_beat", "0001_initial")]
    operations: ClassVar = [migrations.RunPython(create, remove)]
