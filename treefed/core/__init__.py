"""treefed.core: the pure broker -- destinations, subscription index, policies, dispatch.

Nothing in this package does I/O or reads a clock; see broker.py for the theory of
operation.  The selector compiler (selector.py) is imported lazily by the broker, so
importing this package does not build the selector grammar.
"""

from treefed.core.actions import (
    Action,
    Close,
    DeleteMessage,
    Log,
    Out,
    Pause,
    Resume,
    StoreMessage,
)
from treefed.core.broker import Broker, ConsumerInfo
from treefed.core.destinations import (
    is_queue,
    is_temp,
    is_topic,
    is_wildcard,
    kind,
    matches,
    parse_destination,
)
from treefed.core.index import SubscriptionIndex
from treefed.core.message import Message
from treefed.core.policy import DestinationPolicy, PolicySet

__all__ = [
    "Action", "Close", "DeleteMessage", "Log", "Out", "Pause", "Resume", "StoreMessage",
    "Broker", "ConsumerInfo", "Message", "SubscriptionIndex", "DestinationPolicy",
    "PolicySet", "parse_destination", "kind", "matches", "is_queue", "is_temp", "is_topic",
    "is_wildcard",
]
