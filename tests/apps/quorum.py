"""A Dramatiq RabbitMQ broker that declares quorum queues.

Dramatiq's ``RabbitmqBroker`` (2.2) has no option for the queue type; its only
hook is the private ``_build_queue_arguments``, used for a queue and its delay
queue alike.
"""

from dramatiq.brokers.rabbitmq import RabbitmqBroker


class QuorumBroker(RabbitmqBroker):
    def _build_queue_arguments(self, queue_name: str) -> dict[str, object]:
        arguments: dict[str, object] = super()._build_queue_arguments(queue_name)
        return {**arguments, "x-queue-type": "quorum"}
