"""The console's pages from the templates shipped in the package, by Jinja2 with
autoescape on: everything a page shows from the store is escaped by the engine."""

from __future__ import annotations

from importlib import resources
from typing import Any

from ..exceptions import missing_extra

try:
    import jinja2
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "console") from None

#: The static files the pages load, by name (nothing else is served from the package).
STATIC = {"console.css": "text/css; charset=utf-8", "refresh.js": "text/javascript"}


class Renderer:
    """Renders the page templates of ``celery_leader/console/templates``."""

    def __init__(self) -> None:
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("celery_leader.console", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )

    def page(self, template: str, **context: Any) -> bytes:
        """Template ``template`` rendered with ``context``, as UTF-8."""
        return self.env.get_template(template).render(**context).encode()


def static(name: str) -> tuple[bytes, str] | None:
    """A static file's bytes and content type; ``None`` for a name not in :data:`STATIC`."""
    if name not in STATIC:
        return None
    return (resources.files("celery_leader.console") / "static" / name).read_bytes(), STATIC[name]
