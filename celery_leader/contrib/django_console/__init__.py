"""The Django app of the console's permissions, ``celery_leader.view_console`` and
``celery_leader.change_console``: add ``"celery_leader.contrib.django_console"`` to
``INSTALLED_APPS`` and migrate. A package of its own, apart from
:mod:`celery_leader.contrib.django`, which imports django-celery-beat's models and so
cannot be imported while Django loads its apps."""
