"""URL helpers shared by config, backends and logging."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# The password runs to the *last* "@" before the path, as urllib (and so
# redis-py and libpq) read it: a password may contain "@".
_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:@/]*):(?P<pw>[^/?#]*)@", re.I)


def mask_url(url: str) -> str:
    """Return ``url`` with its password replaced by ``***``; only the ``user:password@``
    part is rewritten, so host lists (Sentinel) and unparsable URLs work too."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@" if m["pw"] else m[0], url)


def scheme_of(url: str) -> str:
    """Lower-cased scheme of ``url`` (empty string when there is none)."""
    return urlsplit(url).scheme.lower()
