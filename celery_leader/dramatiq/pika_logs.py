"""Quiet pika's own reports of a failed connection attempt on a RabbitMQ broker: about
seven ERROR records an attempt, one with a traceback, become DEBUG records. Whoever
catches Dramatiq's ``ConnectionClosed`` (which names the cause) reports it once.
"""

from __future__ import annotations

import logging
from typing import Any

#: pika's loggers that report failed connection attempts.
LOGGERS = (
    "pika.adapters.utils.connection_workflow",
    "pika.adapters.utils.io_services_utils",
    "pika.adapters.blocking_connection",
)


class _ConnectAttemptsAtDebug(logging.Filter):
    """Turns the ERROR records of a failed connection attempt into DEBUG records."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not _about_connecting(record):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.exc_info, record.exc_text = None, None
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def _about_connecting(record: logging.LogRecord) -> bool:
    if record.name == "pika.adapters.utils.connection_workflow":
        return True  # it only logs about connecting
    if record.name == "pika.adapters.blocking_connection":
        return record.funcName == "_create_connection"
    return str(record.msg).startswith(_SOCKET_CONNECT)


#: io_services_utils's messages about a socket that failed to connect.
_SOCKET_CONNECT = ("Socket failed to connect", "%s.connect(%s) failed")


def quiet_connect_errors(broker: Any) -> None:
    """On a Dramatiq ``RabbitmqBroker``, add the filter to pika's loggers (once)."""
    if type(broker).__module__ != "dramatiq.brokers.rabbitmq":
        return
    for name in LOGGERS:
        pika_logger = logging.getLogger(name)
        if not any(isinstance(f, _ConnectAttemptsAtDebug) for f in pika_logger.filters):
            pika_logger.addFilter(_ConnectAttemptsAtDebug())
