"""`otela demo`'s choice of ports: a port a stopped demo left in TIME_WAIT is reused, a held one is named."""

from __future__ import annotations

import socket

import pytest

from opentela.cli.demo import can_listen, listen_addr
from opentela.cli.localmesh import free_port
from opentela.errors import ConfigError


def _time_wait_port() -> int:
    """A port whose server closed a connection first and stopped listening: what a demo leaves behind."""
    port = free_port()
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        with socket.create_connection(("127.0.0.1", port)) as client:
            served, _ = listener.accept()
            served.close()  # the server's side closes first: its port goes to TIME_WAIT
            client.recv(1)
    return port


def test_a_port_in_time_wait_is_used_again() -> None:
    port = _time_wait_port()
    with socket.socket() as plain:  # a bind without SO_REUSEADDR is refused while the old connection lingers
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))
    assert can_listen("127.0.0.1", port)
    assert listen_addr(f"127.0.0.1:{port}", 8092, "--http") == ("127.0.0.1", port)
    assert listen_addr(None, port, "--http") == ("127.0.0.1", port)


def test_a_held_port_is_named_or_replaced() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert not can_listen("127.0.0.1", port)
        with pytest.raises(ConfigError, match="in use by a running process"):
            listen_addr(f"127.0.0.1:{port}", 8092, "--http")
        host, other = listen_addr(None, port, "--http")  # the usual port is taken: another one, said so
        assert host == "127.0.0.1" and other != port and can_listen(host, other)
