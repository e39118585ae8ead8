"""Tests for treefed.security.patterns: covering with wildcards and placeholders."""

from __future__ import annotations

import pytest

from treefed.errors import DestinationError
from treefed.security.patterns import compile_pattern


def covers(pattern: str, target: str, **bindings) -> bool:
    return compile_pattern(pattern, ("user", "child", "subtree")).covers(target, bindings)


class TestCovers:
    @pytest.mark.parametrize("pattern,target", [
        ("queue://A.B", "queue://A.B"),
        ("queue://A.*", "queue://A.B"),
        ("queue://A.>", "queue://A.B.C"),
        ("queue://A.>", "queue://A.*"),
        ("queue://A.>", "queue://A.B.>"),
        ("queue://A.*.C", "queue://A.*.C"),
        ("queue://>", "queue://anything.at.all"),
        (">", "topic://X"),
        (">", "temp-queue://abc"),
        ("A.B", "queue://A.B"),
    ])
    def test_covered(self, pattern, target):
        """Everything the target can name lies inside the pattern."""
        assert covers(pattern, target)

    @pytest.mark.parametrize("pattern,target", [
        ("queue://A.B", "topic://A.B"),        # kind differs
        ("queue://A.B", "queue://A.B.C"),
        ("queue://A.*", "queue://A.B.C"),
        ("queue://A.*", "queue://A.>"),         # a subscription reaching deeper
        ("queue://A.>", "queue://A"),           # > needs at least one segment
        ("queue://A.B.>", "queue://A.>"),       # wider subscription than the grant
        ("queue://A.B.>", "queue://A.*.C"),
        ("queue://A.B", "queue://A.*"),
    ])
    def test_not_covered(self, pattern, target):
        """Something the target can name lies outside the pattern."""
        assert not covers(pattern, target)

    def test_placeholder_binds_to_a_set(self):
        """{child} covers exactly the literals bound to it."""
        assert covers("queue://Store.{child}.>", "queue://Store.s1.Orders", child={"s1"})
        assert not covers("queue://Store.{child}.>", "queue://Store.s2.Orders", child={"s1"})
        assert covers("queue://Store.{subtree}.>", "queue://Store.s2.x", subtree={"s1", "s2"})

    def test_placeholder_never_covers_a_wildcard(self):
        """A wildcard in the placeholder's position reaches names outside the set."""
        assert not covers("queue://Store.{child}.>", "queue://Store.*.Orders", child={"s1"})
        assert not covers("queue://Store.{child}.>", "queue://Store.>", child={"s1"})

    def test_unbound_placeholder_covers_nothing(self):
        """A placeholder with no binding refuses, it does not match anything."""
        assert not covers("queue://Store.{child}.>", "queue://Store.s1.x")


class TestCompilePattern:
    def test_bare_name_is_a_queue(self):
        """A pattern without a kind is a queue pattern, like destinations."""
        assert compile_pattern("A.>").text == "queue://A.>"

    @pytest.mark.parametrize("text,words", [
        ("queue://Store.{nobody}.>", "unknown placeholder"),
        ("queue://Store-{user}.>", "whole segment"),
        ("queue://A.>.B", "last segment"),
        ("queue://A..B", "empty segment"),
        ("ftp://A", "unknown destination kind"),
    ])
    def test_invalid_patterns_say_why(self, text, words):
        """Bad patterns raise DestinationError naming the problem."""
        with pytest.raises(DestinationError) as info:
            compile_pattern(text, ("user",))
        assert words in info.value.message
