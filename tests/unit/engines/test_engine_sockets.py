"""Unix sockets beside TCP: which engines get one, where, and the simulated engine answering on it."""

from __future__ import annotations

import os
import stat

from opentela.engines._registry import engine_adapter
from opentela.engines.base import engine_socket_path, find_flag, prepare_socket_path
from opentela.engines.simulated import SimulatedServer
from opentela.engines.simulated_config import SimulatedConfig
from opentela.node.engine_client import EngineClient, EngineTarget


def test_engines_that_can_get_a_socket_beside_their_port() -> None:
    for name in ("simulated", "embedded"):
        spec = engine_adapter(name).build(None, 23456)
        assert spec.unix_socket == engine_socket_path(name, 23456)
        assert find_flag(spec.argv, "--uds") == spec.unix_socket and spec.port == 23456
        assert spec.unix_socket.endswith(f"otela-{name}-23456.sock")  # llama.cpp serves only *.sock paths


def test_a_wrapped_command_gets_a_socket_unless_it_names_one(tmp_path) -> None:
    sim = engine_adapter("simulated")
    spec = sim.from_command(["otela", "engine", "simulated", "--port", "23457"])
    assert spec.unix_socket == engine_socket_path("simulated", 23457)
    mine = str(tmp_path / "mine.sock")
    spec = sim.from_command(["otela", "engine", "simulated", "--port", "23457", "--uds", mine])
    assert spec.unix_socket == mine and spec.argv.count("--uds") == 1


def test_engines_whose_socket_would_replace_tcp_get_none() -> None:
    spec = engine_adapter("vllm").from_command(["vllm", "serve", "m", "--port", "8000"])
    assert spec.unix_socket is None and "--uds" not in spec.argv


def test_socket_folder_is_private_and_a_stale_socket_is_cleared(tmp_path) -> None:
    import socket

    path = str(tmp_path / "run" / "e.sock")
    assert prepare_socket_path(path) == path
    assert stat.S_IMODE(os.stat(tmp_path / "run").st_mode) == 0o700
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()  # the file stays, as after a SIGKILL
    assert prepare_socket_path(path) == path and not os.path.exists(path)


async def test_the_simulated_engine_answers_on_its_socket(tmp_path) -> None:
    sock_file = tmp_path / "sim.sock"
    sock = str(sock_file)
    config = SimulatedConfig(ttft_ms=0, itl_ms=0, default_max_tokens=2, uds=sock)
    async with SimulatedServer(config) as server:
        client = EngineClient()
        # A TCP address nobody listens on: only the socket can answer.
        target = EngineTarget("http://127.0.0.1:9", sock)
        body = b'{"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}'
        headers = {"content-type": "application/json"}
        async with client.request(target, "POST", "/v1/chat/completions", body, headers) as resp:
            assert resp.status == 200
            assert b"chat.completion" in await resp.read()
        await client.aclose()
        assert server.base_url.startswith("http://127.0.0.1:")
    assert not sock_file.exists()  # removed on shutdown
