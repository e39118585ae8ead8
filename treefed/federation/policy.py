"""ConnectorPolicy: what a connector kind must answer for one link.

Theory of operation
-------------------
``mesh.py`` and ``tree.py`` are the two implementations, read side by side.  A policy
belongs to one link (``Bridge.policy``) and answers questions; the Bridge and the Site
act on the answers.  The routing of interest between lanes is not a policy question:
it is the one table in ``routing.py``.

Contract (checked by tests/federation/test_structure.py):

* ``accept`` and ``offer`` have **no side effects** on the Site, the Bridge or the
  advisory: they return a reason from ``events.DROP_REASONS`` (refused; the Bridge turns
  it into a ``Drop``), ``None`` (accepted / may be sent) or, for ``offer``, ``SKIP``
  (not for this link, nothing to log).  A policy may memoise pure answers (the mesh
  permission cache), nothing else;
* ``claims`` names the brokers an accepted advisory places in the peer's subtree; the
  Bridge applies them only after every check, its own per-link limit included, passed;
* ``demand_priority`` / ``conduit`` / ``conduit_selector`` / ``suppresses`` shape the
  demand an accepted interest creates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from treefed.federation.bridge import Bridge, Interest
    from treefed.wire.frames import Advisory

__all__ = ["ConnectorPolicy", "SKIP"]

#: ``offer`` result meaning "not for this link, nothing to log".
SKIP = ""


@runtime_checkable
class ConnectorPolicy(Protocol):
    kind: ClassVar[str]       # "mesh" | "tree": the routing.ROUTES key
    replay: ClassVar[bool]    # a rested message may later be sent back along its path
    message_ttl: int          # hops a forwarded message may make (-1: unlimited)
    merges_selectors: ClassVar[bool]  # conduits keep a MergedSelector (any member
    #                                   matches) instead of conduit_selector's text

    def accept(self, bridge: "Bridge", adv: "Advisory") -> str | None:
        """Why an advisory arriving over ``bridge`` is refused, or None.  No effects."""

    def claims(self, bridge: "Bridge", adv: "Advisory") -> Sequence[str]:
        """Brokers an accepted ``adv`` places in ``bridge``'s subtree (may be empty)."""

    def offer(self, bridge: "Bridge", it: "Interest") -> str | None:
        """Why ``it`` must not be sent on ``bridge`` (``SKIP``: silently), or None."""

    def demand_priority(self, hops: int) -> int:
        """Priority of the demand an interest ``hops`` brokers away creates."""

    def conduit(self, dst: str, hops: int) -> bool:
        """Whether that demand joins its link's per-destination conduit."""

    def conduit_selector(self, selectors: dict[str | None, int]) -> str | None:
        """The selector of a conduit whose members have ``selectors`` (with counts)."""

    def suppresses(self, dst: str) -> bool:
        """Whether only one instance per consumer id of ``dst`` may hold demand."""
