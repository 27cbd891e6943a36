"""The demo's broker: Celery's filesystem transport, with messages written atomically.

kombu's filesystem transport creates a message file, then locks it and writes
it; the consumer moves files out without taking the lock. On a busy machine
the worker can move a file that is still empty, fail to decode it and stop
("Unrecoverable error"), and the demo then sees no more runs. Here a message
is written under a name the consumer skips and renamed into place when whole.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    """A filesystem channel whose messages appear in the folder only when complete."""

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        # Same name scheme as kombu's (creation order, then queue), so the consumer
        # reads messages in the order they were sent.
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # A leading dot: the consumer only takes names ending in ".<queue>.msg" after
        # the first dot, and this one's first dot is its leading one.
        partial = os.path.join(self.data_folder_out, f".{name}.partial")
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)  # atomic within one directory
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    """``filesystem://`` with atomic writes (see the module docstring)."""

    Channel = Channel
