"""``python -m celery_leader.dramatiq MODULE``: the standalone scheduler."""

import sys

from .runner import standalone

sys.exit(standalone())
