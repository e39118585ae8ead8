"""Tests for treefed.transport.uri (pure parsing)."""

from __future__ import annotations

import dataclasses

import pytest

from treefed.errors import ConfigError
from treefed.transport.uri import Endpoint, Failover, Static, parse_uri


def config_error(text: str, **kw) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_uri(text, **kw)
    return info.value


class TestEndpoint:
    def test_tcp_host_port(self):
        """tcp://host:port parses to an Endpoint that renders back the same."""
        ep = parse_uri("tcp://broker-1.example.com:61616")
        assert ep == Endpoint("tcp", "broker-1.example.com", 61616)
        assert str(ep) == "tcp://broker-1.example.com:61616"
        assert ep.endpoints == (ep,)

    def test_ipv6_in_brackets(self):
        """An IPv6 host is written in brackets and stored without them."""
        ep = parse_uri("tcp://[::1]:5672")
        assert ep == Endpoint("tcp", "::1", 5672)
        assert str(ep) == "tcp://[::1]:5672"

    def test_ssl_is_parsed(self):
        """ssl://host:port parses (the transport itself comes later)."""
        assert parse_uri("ssl://10.0.0.1:61617") == Endpoint("ssl", "10.0.0.1", 61617)

    def test_scheme_is_case_insensitive_and_whitespace_trimmed(self):
        """TCP:// and surrounding spaces are accepted."""
        assert parse_uri("  TCP://h:1 ") == Endpoint("tcp", "h", 1)

    def test_endpoint_is_frozen(self):
        """Parsed values are immutable."""
        with pytest.raises(dataclasses.FrozenInstanceError):
            parse_uri("tcp://h:1").port = 2

    @pytest.mark.parametrize("text, needle", [
        ("tcp://h", "port is required"),
        ("tcp://h:", "not a number"),
        ("tcp://h:http", "not a number"),
        ("tcp://h:-1", "not a number"),
        ("tcp://h:0", "out of range"),
        ("tcp://h:65536", "out of range"),
        ("tcp://::1:5", "brackets"),
        ("tcp://[1.2.3.4]:5", "not an IPv6"),
        ("tcp://[::1]5", "[ipv6]:port"),
        ("tcp://:5", "invalid host"),
        ("tcp://bad host:5", "invalid host"),
        ("tcp://h:1/path", "only host:port"),
        ("tcp://user@h:1", "only host:port"),
        ("tcp://h:1?connectionTimeout=5", "unknown option 'connectionTimeout'"),
        ("http://h:1", "unsupported scheme 'http'"),
        ("h", "not a URI"),
    ])
    def test_bad_endpoints(self, text, needle):
        """Malformed endpoint URIs are ConfigErrors that say what is wrong."""
        err = config_error(text)
        assert needle in err.message and err.key == "uri"

    def test_bare_host_port_is_refused_with_a_hint(self):
        """host:port without a scheme is refused, suggesting tcp://host:port."""
        assert "tcp://localhost:61616" in config_error("localhost:61616").message
        assert "tcp://10.1.2.3:61616" in config_error("10.1.2.3:61616").message

    def test_port_zero_only_when_listening(self):
        """Port 0 (any free port) is valid for a listen URI only."""
        assert parse_uri("tcp://127.0.0.1:0", listen=True).port == 0
        assert "out of range" in config_error("tcp://127.0.0.1:0").message

    def test_key_names_the_config_entry(self):
        """The caller's config key is carried in the error."""
        assert config_error("tcp://h", key="connectors.up.uri").key == "connectors.up.uri"

    def test_non_string(self):
        """A non-string value is a clear ConfigError, not a crash."""
        assert "expected a URI string" in config_error(61616).message


class TestFailover:
    def test_defaults_follow_activemq(self):
        """failover: defaults are 10 ms, 30 s, exponential x2, unlimited, randomized."""
        fo = parse_uri("failover:(tcp://a:1,tcp://b:2)")
        assert fo == Failover((Endpoint("tcp", "a", 1), Endpoint("tcp", "b", 2)))
        assert (fo.initial_reconnect_delay, fo.max_reconnect_delay) == (0.010, 30.0)
        assert fo.use_exponential_backoff and fo.backoff_multiplier == 2.0
        assert fo.max_reconnect_attempts == -1 and fo.retry_limit is None
        assert fo.randomize is True

    def test_options_in_activemq_units(self):
        """Options use ActiveMQ names, milliseconds become seconds."""
        fo = parse_uri("failover:(tcp://a:1)?initialReconnectDelay=100&maxReconnectDelay=5000"
                       "&useExponentialBackOff=FALSE&backOffMultiplier=1.5"
                       "&maxReconnectAttempts=3&randomize=false")
        assert fo.initial_reconnect_delay == 0.1 and fo.max_reconnect_delay == 5.0
        assert fo.use_exponential_backoff is False and fo.backoff_multiplier == 1.5
        assert fo.retry_limit == 3 and fo.randomize is False

    def test_zero_attempts_means_no_retry(self):
        """failover maxReconnectAttempts=0 allows the initial connect only."""
        assert parse_uri("failover:(tcp://a:1)?maxReconnectAttempts=0").retry_limit == 0

    def test_forms_without_parentheses_and_with_slashes(self):
        """failover:uri,uri and failover://(...) are accepted as ActiveMQ does."""
        two = (Endpoint("tcp", "a", 1), Endpoint("tcp", "b", 2))
        assert parse_uri("failover:tcp://a:1,tcp://b:2").endpoints == two
        assert parse_uri("failover://(tcp://a:1, tcp://b:2)").endpoints == two

    def test_renders_back_to_an_equal_uri(self):
        """str() gives ActiveMQ syntax that parses to the same value."""
        fo = parse_uri("failover:(tcp://a:1,tcp://[::1]:2)?randomize=false"
                       "&initialReconnectDelay=250")
        assert parse_uri(str(fo)) == fo
        assert str(parse_uri("failover:(tcp://a:1)")) == "failover:(tcp://a:1)"

    @pytest.mark.parametrize("text, needle", [
        ("failover:(tcp://a:1)?timeout=5", "unknown option 'timeout'"),
        ("failover:(tcp://a:1)?randomize=yes", "expected true or false"),
        ("failover:(tcp://a:1)?randomize", "needs a value"),
        ("failover:(tcp://a:1)?initialReconnectDelay=-5", ">= 0"),
        ("failover:(tcp://a:1)?initialReconnectDelay=1.5", "expected an integer"),
        ("failover:(tcp://a:1)?backOffMultiplier=0.5", ">= 1"),
        ("failover:(tcp://a:1)?backOffMultiplier=nan", ">= 1"),
        ("failover:(tcp://a:1)?maxReconnectAttempts=-2", "-1 or more"),
        ("failover:(tcp://a:1)?randomize=true&randomize=false", "twice"),
        ("failover:(tcp://a:1)?initialReconnectDelay=5000&maxReconnectDelay=100", "below"),
        ("failover:(tcp://a:1", "missing ')'"),
        ("failover:(tcp://a:1)x", "unexpected"),
        ("failover:()", "empty endpoint"),
        ("failover:(tcp://a:1,)", "empty endpoint"),
        ("failover:(tcp://a)", "port is required"),
        ("failover:(failover:(tcp://a:1))", "nested"),
    ])
    def test_bad_failover_uris(self, text, needle):
        """Bad lists and options are ConfigErrors naming the problem."""
        assert needle in config_error(text).message

    def test_composite_cannot_be_listened_on(self):
        """A listen URI must be a single endpoint."""
        assert "cannot be listened on" in config_error("failover:(tcp://a:1)",
                                                       listen=True).message


class TestStatic:
    def test_defaults_follow_the_static_agent(self):
        """static: defaults are 1 s, 30 s, exponential x2, 0 = unlimited, in order."""
        st = parse_uri("static:(tcp://a:1,tcp://b:2)")
        assert isinstance(st, Static)
        assert (st.initial_reconnect_delay, st.max_reconnect_delay) == (1.0, 30.0)
        assert st.max_reconnect_attempts == 0 and st.retry_limit is None
        assert st.randomize is False
        assert [e.port for e in st.endpoints] == [1, 2]

    def test_attempt_limit(self):
        """A positive maxReconnectAttempts is the limit."""
        assert parse_uri("static:(tcp://a:1)?maxReconnectAttempts=4").retry_limit == 4

    def test_static_double_slash_form(self):
        """static://(...) is accepted as in ActiveMQ's discovery examples."""
        assert parse_uri("static://(tcp://localhost:61616)").endpoints[0].port == 61616

    def test_unknown_option_is_named(self):
        """Unknown static options name themselves and list the known ones."""
        err = config_error("static:(tcp://a:1)?networkTTL=2")
        assert "'networkTTL'" in err.message and "initialReconnectDelay" in err.message
