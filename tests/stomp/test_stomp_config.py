"""STOMP listener URIs in the configuration: accepted on listen, TLS needs a
certificate, never a dial target."""

from __future__ import annotations

import pytest

from treefed.config import parse_config
from treefed.errors import ConfigError
from treefed.transport.uri import Endpoint, parse_uri


def doc(listen: list[str], **extra) -> dict:
    return {"broker": {"id": "b", "data_dir": "/tmp/unused", "listen": listen}, **extra}


class TestStompListenURIs:
    def test_stomp_listeners_accepted(self):
        """stomp:// and stomp+ssl:// (with a certificate) are valid listeners."""
        parse_config(doc(["stomp://127.0.0.1:0"]))
        assert parse_uri("stomp+ssl://0.0.0.0:61614", listen=True) == Endpoint(
            "stomp+ssl", "0.0.0.0", 61614)

    def test_stomp_ssl_needs_certificate(self):
        """A stomp+ssl:// listener without security.tls.cert is a config error naming
        the listener."""
        with pytest.raises(ConfigError) as e:
            parse_config(doc(["stomp+ssl://127.0.0.1:0"]))
        assert "stomp+ssl:// listener broker.listen[0]" in str(e.value)

    def test_stomp_is_not_a_dial_target(self):
        """A connector cannot dial stomp:// (brokers link over the native protocol)."""
        with pytest.raises(ConfigError):
            parse_uri("stomp://127.0.0.1:61613")
        with pytest.raises(ConfigError):
            parse_config({**doc(["tcp://127.0.0.1:0"]),
                          "tree_connector": {"node_type": "leaf",
                                             "uri": "stomp://127.0.0.1:61613"}})
