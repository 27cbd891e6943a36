"""URLs: the admin, where django-celery-beat's periodic tasks are edited, and the
celery-leader console at /leader/ (for staff with its permissions)."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("leader/", include("celery_leader.contrib.django.urls")),
]
