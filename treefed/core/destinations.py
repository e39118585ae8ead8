"""Destination names: parsing to canonical form, kinds, wildcard matching.

Theory of operation
-------------------
Every destination the broker handles is a canonical string ``<kind>://<name>`` where kind
is one of ``queue``, ``topic``, ``temp-queue``, ``temp-topic``.  ``parse_destination`` is
the one gate: a bare name becomes a queue, anything malformed raises DestinationError
naming the problem.  The name is ``.``-separated segments; a segment is non-empty and
holds no whitespace, control character or ``/``.  In subscriptions and filters
(``allow_wildcards=True``) a whole segment may be ``*`` (exactly one segment) or ``>``
(one or more remaining segments, last segment only) -- so ``PRICE.>`` matches
``PRICE.STOCK`` but not ``PRICE`` itself.  A wildcard character inside a segment
(``PRI*``) is refused rather than taken literally, so a typo cannot silently subscribe
to a name nobody sends to.

Parsing is on the per-message path (every Send names a destination), so results are
memoised; the helpers below assume canonical input and stay allocation-light.
Never: does I/O, or accepts a name longer than MAX_LENGTH characters.
"""

from __future__ import annotations

import re
from functools import lru_cache

from treefed.errors import DestinationError

__all__ = [
    "KINDS",
    "MAX_LENGTH",
    "parse_destination",
    "kind",
    "name_of",
    "is_queue",
    "is_topic",
    "is_temp",
    "is_wildcard",
    "matches",
]

#: The destination kinds, i.e. the schemes of canonical names.
KINDS = ("queue", "topic", "temp-queue", "temp-topic")
#: Longest destination text accepted, in characters.
MAX_LENGTH = 1024

# One bad character anywhere in a segment: whitespace, control characters, '/', and the
# wildcard characters (whole-segment wildcards are recognised before this runs).
_BAD_CHAR = re.compile(r"[\s\x00-\x1f\x7f/*>]")


def parse_destination(text: str, *, allow_wildcards: bool = False) -> str:
    """Return the canonical form of ``text`` or raise DestinationError saying why not."""
    if not isinstance(text, str):
        raise DestinationError(f"destination must be a string, not {type(text).__name__}")
    return _parse(text, allow_wildcards)


@lru_cache(maxsize=8192)
def _parse(text: str, allow_wildcards: bool) -> str:
    # lru_cache does not cache exceptions, so garbage is re-checked (and refused) each time.
    if len(text) > MAX_LENGTH:
        raise DestinationError(f"destination longer than {MAX_LENGTH} characters")
    scheme, sep, name = text.partition("://")
    if not sep:
        scheme, name = "queue", text
    elif scheme not in KINDS:
        raise DestinationError(
            f"unknown destination kind {scheme!r} in {text!r} "
            "(expected queue://, topic://, temp-queue:// or temp-topic://)"
        )
    if not name:
        raise DestinationError(f"empty destination name in {text!r}")
    segments = name.split(".")
    last = len(segments) - 1
    for i, seg in enumerate(segments):
        if not seg:
            raise DestinationError(f"empty segment {i + 1} in {text!r}")
        if seg == "*" or seg == ">":
            if not allow_wildcards:
                raise DestinationError(f"wildcard {seg!r} is not allowed here: {text!r}")
            if seg == ">" and i != last:
                raise DestinationError(f"'>' must be the last segment: {text!r}")
            continue
        bad = _BAD_CHAR.search(seg)
        if bad is not None:
            ch = bad.group()
            what = "wildcard inside a segment" if ch in "*>" else "character"
            raise DestinationError(f"{what} {ch!r} not allowed in segment {seg!r} of {text!r}")
    return f"{scheme}://{name}"


def kind(dst: str) -> str:
    """``"queue"``, ``"topic"``, ``"temp-queue"`` or ``"temp-topic"`` of a canonical name."""
    scheme, sep, _ = dst.partition("://")
    if not sep or scheme not in KINDS:
        raise DestinationError(f"not a canonical destination: {dst!r}")
    return scheme


def name_of(dst: str) -> str:
    """The name part (after ``://``) of a canonical destination."""
    return dst.partition("://")[2]


def is_queue(dst: str) -> bool:
    """True for ``queue://`` and ``temp-queue://`` (competing consumers)."""
    return dst.startswith("queue://") or dst.startswith("temp-queue://")


def is_topic(dst: str) -> bool:
    """True for ``topic://`` and ``temp-topic://`` (every subscription gets a copy)."""
    return dst.startswith("topic://") or dst.startswith("temp-topic://")


def is_temp(dst: str) -> bool:
    return dst.startswith("temp-")


def is_wildcard(dst: str) -> bool:
    """True when a canonical pattern holds a ``*`` or ``>`` segment."""
    # Canonical names only carry these characters as whole wildcard segments.
    name = name_of(dst)
    return "*" in name or ">" in name


def matches(pattern: str, dst: str) -> bool:
    """Does canonical ``pattern`` (wildcards allowed) match canonical ``dst``?"""
    p_kind, _, p_name = pattern.partition("://")
    d_kind, _, d_name = dst.partition("://")
    if p_kind != d_kind:
        return False
    if p_name == d_name:
        return True
    p_segs = p_name.split(".")
    d_segs = d_name.split(".")
    for i, seg in enumerate(p_segs):
        if seg == ">":
            return len(d_segs) > i
        if i >= len(d_segs) or (seg != "*" and seg != d_segs[i]):
            return False
    return len(p_segs) == len(d_segs)
