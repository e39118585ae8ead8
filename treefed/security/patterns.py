"""Permission patterns: destination wildcards with ``{placeholder}`` segments.

Theory of operation
-------------------
A permission pattern is a destination pattern (``queue://Store.*.Orders``,
``topic://Broadcast.>``) in which a whole segment may also be a placeholder such as
``{user}``, ``{child}`` or ``{subtree}``, bound at check time to a *set* of literal
names: ``queue://Store.{child}.>`` with ``child={"uk-0001"}`` is
``queue://Store.uk-0001.>``.  Binding at check time instead of expanding the text keeps a
region's scope one pattern however many stores its subtree holds.  The bare pattern
``>`` means every destination of every kind.

``Pattern.covers(target, bindings)`` answers "is *everything* ``target`` can name inside
this pattern?".  ``target`` may itself hold wildcards: a subscription on
``queue://Store.>`` is covered by ``queue://>`` but not by ``queue://Store.uk-0001.>``,
because it would also receive other stores' messages.  For a literal destination,
covering is plain matching.  A placeholder only ever covers a *literal* segment in the
bound set, never ``*`` or ``>``: a wildcard would reach names outside the set.

Never: does I/O, or accepts a wildcard or placeholder inside a segment (``Store-*``,
``{child}-x``): a pattern that silently matched nothing would be an unnoticed hole or an
unnoticed outage.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from treefed.core.destinations import parse_destination
from treefed.errors import DestinationError

__all__ = ["Pattern", "compile_pattern", "ANY"]

#: The pattern that covers every destination of every kind.
ANY = ">"

_NO_BINDINGS: Mapping[str, Collection[str]] = {}


class Pattern:
    """A compiled permission pattern; see the module docstring."""

    __slots__ = ("text", "kind", "segments", "placeholders")

    def __init__(self, text: str, kind: str | None, segments: tuple[str, ...],
                 placeholders: frozenset[str]) -> None:
        self.text = text                  # canonical text, as shown in logs and errors
        self.kind = kind                  # destination kind; None = every kind (ANY)
        self.segments = segments          # name segments; placeholders keep their braces
        self.placeholders = placeholders  # placeholder names used, without braces

    def __repr__(self) -> str:
        return f"Pattern({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pattern) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def covers(self, target: str,
               bindings: Mapping[str, Collection[str]] = _NO_BINDINGS) -> bool:
        """True when every destination ``target`` (canonical, wildcards allowed) can name
        matches this pattern under ``bindings`` (placeholder -> allowed literals)."""
        if self.kind is None:
            return True
        kind, _, name = target.partition("://")
        if kind != self.kind:
            return False
        return _covers(self.segments, name.split("."), bindings)


def _covers(pattern: tuple[str, ...], target: list[str],
            bindings: Mapping[str, Collection[str]]) -> bool:
    n = len(target)
    for i, p in enumerate(pattern):
        if p == ">":
            return n > i          # any segments from here on, at least one
        if i >= n:
            return False
        t = target[i]
        if t == ">":
            return False          # the target reaches arbitrarily deep; we do not
        if p == "*":
            continue              # one segment, literal or "*"
        if p[0] == "{":
            allowed = bindings.get(p[1:-1])
            if allowed is None or t == "*" or t not in allowed:
                return False
        elif t != p:
            return False
    return len(pattern) == n


def compile_pattern(text: str, placeholders: Collection[str] = ()) -> Pattern:
    """Compile ``text``; ``placeholders`` are the names allowed in braces.  Raises
    DestinationError saying what is wrong."""
    if not isinstance(text, str):
        raise DestinationError(f"pattern must be a string, not {type(text).__name__}")
    if text.strip() == ANY:
        return Pattern(ANY, None, (), frozenset())
    kind, sep, name = text.partition("://")
    if not sep:
        kind, name = "queue", text
    segments = name.split(".")
    used: set[str] = set()
    # Validate the destination syntax with each placeholder replaced by a plain segment,
    # so the placeholders are the only thing this function has to check itself.
    probe = []
    for seg in segments:
        if seg.startswith("{") and seg.endswith("}"):
            ident = seg[1:-1]
            if ident not in placeholders:
                known = ", ".join("{%s}" % p for p in sorted(placeholders)) or "none"
                raise DestinationError(f"unknown placeholder {seg!r} in {text!r} "
                                       f"(allowed here: {known})")
            used.add(ident)
            probe.append("x")
        elif "{" in seg or "}" in seg:
            raise DestinationError(f"a placeholder must be a whole segment: {seg!r} "
                                   f"in {text!r}")
        else:
            probe.append(seg)
    canonical = parse_destination(f"{kind}://{'.'.join(probe)}", allow_wildcards=True)
    kind = canonical.partition("://")[0]
    return Pattern(f"{kind}://{name}", kind, tuple(segments), frozenset(used))
