"""Tests for treefed.transport.backoff (pure)."""

from __future__ import annotations

import random

import pytest

from treefed.errors import ConfigError
from treefed.transport.backoff import Backoff, backoff_for
from treefed.transport.uri import parse_uri


def delays(backoff: Backoff, n: int, seed: int = 1) -> list:
    rng = random.Random(seed)
    return [backoff.next_delay(rng) for _ in range(n)]


class TestBackoff:
    def test_exponential_schedule_is_capped(self):
        """First connect is immediate, then initial, doubling, capped at maximum."""
        assert delays(Backoff(1.0, 10.0), 7) == [0.0, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]

    def test_constant_schedule(self):
        """Without exponential back-off every retry waits initial."""
        assert delays(Backoff(0.5, 30.0, exponential=False), 4) == [0.0, 0.5, 0.5, 0.5]

    def test_multiplier(self):
        """The multiplier sets the growth factor."""
        assert delays(Backoff(1.0, 100.0, multiplier=3.0), 4) == [0.0, 1.0, 3.0, 9.0]

    def test_max_attempts_counts_retries(self):
        """With N, the initial connect plus N retries are allowed, then None."""
        assert delays(Backoff(1.0, 10.0, max_attempts=2), 4) == [0.0, 1.0, 2.0, None]
        assert delays(Backoff(1.0, 10.0, max_attempts=0), 2) == [0.0, None]

    def test_unlimited_never_gives_up(self):
        """max_attempts=None keeps returning delays."""
        assert None not in delays(Backoff(0.01, 1.0), 500)

    def test_long_lived_connection_resets_delay(self):
        """A connection that lived >= reset_after starts the next round at initial."""
        b = Backoff(1.0, 60.0, reset_after=5.0)
        delays(b, 5)                        # 0, 1, 2, 4, 8: next would be 16
        b.connected(100.0)
        b.disconnected(105.0)
        assert delays(b, 3) == [1.0, 2.0, 4.0]

    def test_short_lived_connection_keeps_growing(self):
        """A connection that died before reset_after continues the growing delay."""
        b = Backoff(1.0, 60.0, reset_after=5.0)
        delays(b, 5)
        b.connected(100.0)
        b.disconnected(104.9)
        assert delays(b, 2) == [16.0, 32.0]

    def test_reconnect_round_has_its_own_budget(self):
        """After a lost connection, max_attempts reconnects are allowed (no free first)."""
        b = Backoff(1.0, 10.0, max_attempts=2)
        delays(b, 2)
        b.connected(0.0)
        assert b.attempts == 0
        b.disconnected(50.0)
        assert delays(b, 3) == [1.0, 2.0, None]
        assert b.attempts == 2

    def test_jitter_stays_within_bounds_and_is_seeded(self):
        """Jitter spreads delays by +/- the fraction, reproducibly from the seed."""
        first = delays(Backoff(1.0, 100.0, jitter=0.2), 6, seed=7)
        again = delays(Backoff(1.0, 100.0, jitter=0.2), 6, seed=7)
        other = delays(Backoff(1.0, 100.0, jitter=0.2), 6, seed=8)
        assert first == again and first != other
        assert first[0] == 0.0
        for got, base in zip(first[1:], [1.0, 2.0, 4.0, 8.0, 16.0]):
            assert 0.8 * base <= got <= 1.2 * base

    def test_jitter_never_exceeds_maximum(self):
        """A jittered delay is capped at maximum too."""
        assert max(delays(Backoff(1.0, 2.0, jitter=0.5), 50)) <= 2.0

    @pytest.mark.parametrize("kwargs", [
        dict(initial=-1.0, maximum=1.0),
        dict(initial=5.0, maximum=1.0),
        dict(initial=1.0, maximum=2.0, multiplier=0.5),
        dict(initial=1.0, maximum=2.0, jitter=1.0),
        dict(initial=1.0, maximum=2.0, max_attempts=-1),
        dict(initial=1.0, maximum=2.0, reset_after=-1.0),
    ])
    def test_invalid_settings(self, kwargs):
        """Nonsense settings are refused with a ConfigError."""
        with pytest.raises(ConfigError):
            Backoff(**kwargs)


class TestBackoffFor:
    def test_failover_uri(self):
        """A failover URI's options become the Backoff's settings."""
        b = backoff_for(parse_uri("failover:(tcp://a:1)?initialReconnectDelay=100"
                                  "&maxReconnectDelay=400&maxReconnectAttempts=4"))
        assert delays(b, 6) == [0.0, 0.1, 0.2, 0.4, 0.4, None]

    def test_static_uri_defaults(self):
        """A static URI gives 1 s doubling to 30 s, unlimited."""
        b = backoff_for(parse_uri("static:(tcp://a:1)"))
        assert delays(b, 8) == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]

    def test_bare_endpoint_tries_once(self):
        """A plain tcp:// endpoint gets a single attempt and no retry."""
        assert delays(backoff_for(parse_uri("tcp://a:1")), 2) == [0.0, None]
