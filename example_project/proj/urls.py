"""URLs: the admin, where django-celery-beat's periodic tasks are edited, and, with
celery-leader[console] installed, the console at /leader/ (for staff with its
permissions)."""

from importlib.util import find_spec

from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("admin/", admin.site.urls)]
# The quickstart runs with celery-leader[celery,django] only: no console there.
if find_spec("jinja2"):
    urlpatterns.append(path("leader/", include("celery_leader.contrib.django.urls")))
