"""The console's model without a table, so Django creates its two permissions."""

from typing import ClassVar

from django.db import migrations, models  # type: ignore[import-untyped, unused-ignore]


class Migration(migrations.Migration):  # type: ignore[misc, unused-ignore]
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[migrations.CreateModel]] = [
        migrations.CreateModel(
            name="Console",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
            ],
            options={"managed": False, "default_permissions": ("view", "change")},
        ),
    ]
