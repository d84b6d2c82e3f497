"""The Celery broker transport: kombu's Redis transport with one Redis client per channel.

kombu's Redis channel builds a new ``redis.Redis`` client for every message
it publishes (``Channel._create_client``, called from ``_put``), and a client
costs more to build than the LPUSH it sends: redis-py fills a table of ~80
response callbacks each time. A client is only a handle on the channel's
connection pool and is safe to share between threads (every command takes a
connection from the pool), so this channel keeps one, as long as the pool is
the same. Everything else, including the consumer's own (asynchronous)
client, is kombu's.

The settings select this transport (``CELERY_BROKER_TRANSPORT``) for a
``redis://`` broker URL; any other URL keeps kombu's transport for its scheme.
"""
from __future__ import annotations

from typing import Any

from kombu.transport import redis


class Channel(redis.Channel):
    _sync_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        client = self._sync_client
        if client is None or client.connection_pool is not self.pool:
            client = self._sync_client = super()._create_client()
        return client


class Transport(redis.Transport):
    Channel = Channel

