"""The console mounted in the example Django project at /leader/, on a Redis store:
Django's login, permissions and CSRF in front of the console's pages and actions.

The project runs in a process of its own (Django's settings are global), with
Django's test client; the script prints what each request got, and the test checks it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "example_project"

#: Three staff users (none, view, view and change) and what each is answered.
SCRIPT = r"""
import json, re
import django
django.setup()
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client

call_command("migrate", verbosity=0)
def staff(name, *codenames):
    user = User.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client

def answer(response):
    return {
        "status": response.status_code,
        "location": response.get("Location"),
        "csp": response.get("Content-Security-Policy"),
        "body": response.content.decode(),
    }

out = {"anonymous": answer(Client().get("/leader/entries"))}
out["staff"] = answer(staff("plain").get("/leader/entries"))
viewer = staff("viewer", "view_console")
out["viewer_page"] = answer(viewer.get("/leader/entries"))
out["viewer_json"] = answer(viewer.get("/leader/api/entries"))
# A valid CSRF token, so the refusal is the console's: this user may not act.
secret = viewer.cookies["csrftoken"].value
out["viewer_post"] = answer(
    viewer.post("/leader/entries/heartbeat/pause", {"reason": "x", "csrfmiddlewaretoken": secret})
)
writer = staff("writer", "view_console", "change_console")
page = writer.get("/leader/entries/heartbeat")
out["writer_page"] = answer(page)
out["no_token"] = answer(writer.post("/leader/entries/heartbeat/pause", {"reason": "deploy"}))
token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
out["with_token"] = answer(
    writer.post(
        "/leader/entries/heartbeat/pause",
        {"reason": "deploy", "csrfmiddlewaretoken": token},
    )
)
out["after"] = json.loads(writer.get("/leader/api/entries/heartbeat").content)
print("RESULT " + json.dumps(out))
"""


def _run(tmp_path: Path, redis_url: str) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": f"{PROJECT}{os.pathsep}{ROOT}",
        "DJANGO_SETTINGS_MODULE": "proj.settings",
        "DEMO_DATA": str(tmp_path),
        "CELERY_LEADER_URL": redis_url,
        "CELERY_LEADER_CONSOLE_WRITE": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> dict[str, Any]:
    with redis_server.client() as client:
        client.flushall()
    return _run(tmp_path_factory.mktemp("django-console"), redis_server.url)


def test_anonymous_is_sent_to_the_login_page(answers: dict[str, Any]) -> None:
    assert answers["anonymous"]["status"] == 302
    assert answers["anonymous"]["location"] == "/admin/login/?next=/leader/entries"


def test_staff_without_the_view_permission_is_refused(answers: dict[str, Any]) -> None:
    assert answers["staff"]["status"] == 403


def test_the_view_permission_shows_the_entries_page_and_its_json(answers: dict[str, Any]) -> None:
    page = answers["viewer_page"]
    assert page["status"] == 200
    assert page["csp"] == "default-src 'self'; frame-ancestors 'none'"
    # Links stay below the prefix the project mounted the console at.
    assert 'href="/leader/entries/heartbeat"' in page["body"]
    assert 'href="/leader/static/console.css"' in page["body"]
    # Without the change permission the page is read-only: no forms, POSTs refused.
    assert 'method="post"' not in page["body"]
    assert answers["viewer_post"]["status"] == 403
    assert "read-only" in answers["viewer_post"]["body"]
    rows = json.loads(answers["viewer_json"]["body"])["entries"]
    assert "heartbeat" in [row["name"] for row in rows]


def test_a_post_without_the_csrf_token_is_refused(answers: dict[str, Any]) -> None:
    assert 'method="post"' in answers["writer_page"]["body"]
    assert answers["no_token"]["status"] == 403
    assert "CSRF" in answers["no_token"]["body"]


def test_a_post_with_the_csrf_token_pauses_the_entry(answers: dict[str, Any]) -> None:
    assert answers["with_token"]["status"] == 303
    assert answers["with_token"]["location"] == "/leader/entries/heartbeat"
    after = answers["after"]
    assert after["enabled"] is False
    assert after["paused"]["why"] == "deploy"
    assert after["paused"]["who"].startswith("django:writer@")
