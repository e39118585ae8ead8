"""treefed.stomp: STOMP 1.0-1.2 for existing applications (pure, no I/O).

``codec`` parses and encodes STOMP frames incrementally (like ``wire.codec``);
``adapter`` maps one STOMP connection onto native frames, so the core, the federation,
the guard and the store see a STOMP client as a native one.  ``node/stomp_conn.py``
serves it on ``stomp://`` and ``stomp+ssl://`` listeners.
"""

from treefed.stomp.adapter import HEADER_MAP, VERSIONS, StompSession
from treefed.stomp.codec import NEED_DATA, StompDecoder, StompFrame, encode

__all__ = ["HEADER_MAP", "VERSIONS", "StompSession", "NEED_DATA", "StompDecoder",
           "StompFrame", "encode"]
