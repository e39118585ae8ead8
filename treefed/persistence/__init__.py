"""treefed.persistence: where persistent messages wait until acked.

``MessageStore`` is the contract (base.py); ``SqliteStore`` keeps messages in
``<data_dir>/messages.db`` (WAL, group commit); ``MemoryStore`` is the same contract in
process memory; ``acquire_lock`` guards a data directory for master/slave.
"""

from treefed.persistence.base import MessageStore
from treefed.persistence.lock import LockHandle, acquire_lock, read_lock
from treefed.persistence.memory import MemoryStore
from treefed.persistence.sqlite import SqliteStore

__all__ = ["MessageStore", "SqliteStore", "MemoryStore", "LockHandle", "acquire_lock",
           "read_lock"]
