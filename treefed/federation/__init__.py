"""treefed.federation: the pure broker-link layer.

One ``Bridge`` state machine per broker link (``bridge.py``), two connector policies read
side by side (``mesh.py``: classic TTL flooding; ``tree.py``: AMQ-2875 up/down rules),
and ``Site``, which wraps a core Broker and owns the bridges.  ``testing.Estate`` wires
many Sites together in one process for tests and the replay engine.
"""

from treefed.federation.bridge import Bridge, Demand, Interest
from treefed.federation.mesh import MeshPolicy
from treefed.federation.settings import LinkSettings, TreeSettings
from treefed.federation.site import POLICIES, Site, check_tree_hello
from treefed.federation.tree import TreePolicy

__all__ = [
    "Bridge",
    "Demand",
    "Interest",
    "LinkSettings",
    "MeshPolicy",
    "POLICIES",
    "Site",
    "TreePolicy",
    "TreeSettings",
    "check_tree_hello",
]
