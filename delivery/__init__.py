"""At-least-once delivery through the broker: the one mechanism (docs/architecture/delivery.md).

The floor right above ``core``: every table whose rows cross the broker
carries the lease columns of :class:`delivery.models.Leased`; this app owns
claiming them (:mod:`delivery.leases`), the only publish to the broker
(:mod:`delivery.broker`), the one backoff (:mod:`delivery.backoff`), the
worker side (:func:`delivery.consume.consume`; :func:`delivery.consume.consume_many`
for a task that carries a batch of rows) and the one sweep
(:mod:`delivery.sweep`). The tables themselves live with their owners
(``workunits.models.Operation`` / ``OutboxMessage``,
``notifications.models.Delivery``), which register what is due.
"""
