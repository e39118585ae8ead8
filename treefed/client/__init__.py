"""treefed.client: the trio client library applications use.

``async with treefed.client.connect("tcp://127.0.0.1:61616") as conn:`` then
``await conn.send(dst, body)``, ``sub = await conn.subscribe(dst)``, ``async for msg in
sub``, ``await msg.ack()``, ``await conn.request(dst, body)``, ``await conn.stat()``.
See ``connection.py`` for how it works.
"""

from treefed.client.connection import (Connection, ConnectionClosed, ReceivedMessage,
                                       Subscription, connect, remote_error)

__all__ = ["connect", "Connection", "Subscription", "ReceivedMessage", "ConnectionClosed",
           "remote_error"]
