"""Ports picked for brokers started later, in other processes (procs engine, tests, benches).

The defect: bind-to-0-and-release handed two brokers of one estate the same port (the store
then failed with "Address already in use" — tests/faults/test_shutdown.py on CI)."""

from __future__ import annotations

import socket

import pytest

from treefed.transport import ports
from treefed.transport.ports import ephemeral_range, free_port, free_ports


def test_never_the_same_port_twice_in_one_process():
    # bind-to-0-and-release gives a repeat within a few hundred calls on Linux
    picked = [free_port() for _ in range(600)] + free_ports(200)
    assert len(set(picked)) == len(picked)


def test_ports_stay_out_of_the_ephemeral_range():
    low, high = ephemeral_range()
    assert all(not low <= p <= high for p in free_ports(50))


def test_a_port_someone_listens_on_is_skipped(monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", free_port()))
        monkeypatch.setattr(ports, "_given", set())    # only the listener may rule it out
        busy.listen()
        taken = busy.getsockname()[1]
        choices = iter([taken, taken + 1 if taken < 30000 else taken - 1])
        monkeypatch.setattr(ports._rng, "randint", lambda a, b: next(choices))
        port = free_port()
    assert port != taken


def test_each_port_is_bindable_by_a_listener():
    for port in free_ports(5):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()


def test_exhaustion_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(ports, "_bindable", lambda port, host: False)
    with pytest.raises(OSError, match="no free port"):
        free_port()
