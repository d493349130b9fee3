"""Adapters recognise their engine's command, find or inject its port, and build commands from options."""

from __future__ import annotations

import socket
import sys

import pytest

from opentela.engines._registry import engine_adapter, engine_from_command, engine_from_name
from opentela.engines.base import EngineSpec, find_flag, free_port
from opentela.engines.embedded import MODEL_ID
from opentela.errors import ConfigError

PY = sys.executable


@pytest.mark.parametrize(
    ("argv", "engine"),
    [
        ("vllm serve Qwen/Qwen3-1.7B", "vllm"),
        ("/opt/venv/bin/vllm serve Qwen/Qwen3-1.7B --tensor-parallel-size 2", "vllm"),
        ("python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-1.7B", "vllm"),
        ("srun --gpus=4 vllm serve meta-llama/Llama-3.1-70B", "vllm"),
        ("python3 -m sglang.launch_server --model-path Qwen/Qwen3-1.7B", "sglang"),
        ("llama-server -m /models/q.gguf", "llamacpp"),
        ("/usr/local/bin/llama-server -hf ggml-org/gemma-3-1b-it-GGUF", "llamacpp"),
        (f"{PY} -m opentela engine embedded --threads 2", "embedded"),
        ("otela engine simulated --ttft-ms 5", "simulated"),
        ("my-server --port 9000", "custom"),
        ("python serve.py --port 9000", "custom"),
        ("vllm bench serve --port 9000", "custom"),  # not `vllm serve`
    ],
)
def test_commands_are_recognised(argv: str, engine: str) -> None:
    assert engine_from_command(argv).name == engine


@pytest.mark.parametrize(
    ("argv", "port"),
    [
        ("vllm serve M --port 8123", 8123),
        ("vllm serve M --port=8124", 8124),
        ("python -m sglang.launch_server --model-path M --port 30123", 30123),
        ("llama-server -m m.gguf --port=8181", 8181),
        ("my-server --port 9000", 9000),
    ],
)
def test_port_found_in_the_command_is_kept(argv: str, port: int) -> None:
    spec = engine_from_command(argv)
    assert spec.port == port
    assert spec.argv == tuple(argv.split())  # nothing injected
    assert spec.base_url == f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(
    "argv", ["vllm serve M", "python -m sglang.launch_server --model-path M", "llama-server -m x"]
)
def test_missing_port_is_injected(argv: str) -> None:
    spec = engine_from_command(argv)
    assert spec.argv[: len(argv.split())] == tuple(argv.split())
    assert spec.argv[-2:] == ("--port", str(spec.port))
    explicit = engine_from_command(argv, port=41234)
    assert explicit.port == 41234 and explicit.argv[-2:] == ("--port", "41234")


def test_injected_port_is_free() -> None:
    port = engine_from_command("vllm serve M").port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_port_zero_is_replaced_and_conflicts_are_errors() -> None:
    spec = engine_from_command("vllm serve M --port 0")
    assert spec.port > 0 and find_flag(spec.argv, "--port") == str(spec.port)
    assert engine_from_command("vllm serve M --port 8000", port=8000).port == 8000
    with pytest.raises(ConfigError, match="8000"):
        engine_from_command("vllm serve M --port 8000", port=9000)
    with pytest.raises(ConfigError, match="invalid port"):
        engine_from_command("vllm serve M --port eighty")


def test_host_flag_decides_where_to_connect() -> None:
    assert engine_from_command("vllm serve M --host 0.0.0.0 --port 8000").host == "127.0.0.1"
    assert engine_from_command("vllm serve M --host 10.1.2.3 --port 8000").base_url == "http://10.1.2.3:8000"
    assert engine_from_command("vllm serve M --host :: --port 8000").host == "127.0.0.1"


def test_custom_needs_a_port_and_says_how() -> None:
    with pytest.raises(ConfigError, match="--port N"):
        engine_from_command("my-server --listen 0.0.0.0")
    spec = engine_from_command("my-server --listen 0.0.0.0", port=7001)
    assert spec.port == 7001 and spec.argv == ("my-server", "--listen", "0.0.0.0")
    templated = engine_from_command(["my-server", "--listen", "127.0.0.1:{port}"])
    assert templated.argv[-1] == f"127.0.0.1:{templated.port}"


def test_command_as_string_is_split_like_a_shell() -> None:
    spec = engine_from_command("vllm serve M --chat-template '{{ x }} y' --port 8001")
    assert spec.argv == ("vllm", "serve", "M", "--chat-template", "{{ x }} y", "--port", "8001")


def test_build_vllm_with_options() -> None:
    spec = engine_from_name(
        "vllm", "Qwen/Qwen3-1.7B", 8100, tensor_parallel_size=2, enforce_eager=True, dtype=None
    )
    assert spec.name == "vllm" and spec.port == 8100
    assert spec.argv == (
        "vllm", "serve", "Qwen/Qwen3-1.7B", "--host", "127.0.0.1", "--port", "8100",
        "--tensor-parallel-size", "2", "--enforce-eager",
    )  # fmt: skip
    assert engine_adapter("vllm").matches(spec.argv)
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        engine_from_name("vllm", "M", 8100, tensor_paralel_size=2)
    with pytest.raises(ConfigError, match="needs a model"):
        engine_from_name("vllm")


def test_build_sglang_and_llamacpp() -> None:
    sg = engine_from_name("sglang", "Qwen/Qwen3-1.7B", 30001, tensor_parallel_size=4)
    assert sg.argv[1:3] == ("-m", "sglang.launch_server") and sg.argv[-2:] == ("--tp-size", "4")
    assert engine_adapter("sglang").matches(sg.argv)
    local = engine_from_name("llamacpp", "/models/m.gguf", 8090, n_gpu_layers=99)
    assert local.argv[:3] == ("llama-server", "-m", "/models/m.gguf")
    assert local.argv[-2:] == ("--n-gpu-layers", "99")
    remote = engine_from_name("llamacpp", "ggml-org/gemma-3-1b-it-GGUF", None)
    assert remote.argv[1] == "-hf" and remote.port > 0


def test_build_embedded_and_simulated() -> None:
    emb = engine_from_name("embedded", port=18123, threads=2, parallel=3)
    assert emb.argv == (
        PY,
        "-m",
        "opentela",
        "engine",
        "embedded",
        "--port",
        "18123",
        "--threads",
        "2",
        "--parallel",
        "3",
        "--uds",
        emb.unix_socket,
    )
    assert emb.unix_socket is not None and emb.unix_socket.endswith("otela-embedded-18123.sock")
    assert engine_from_name("embedded", MODEL_ID, None).port > 0
    with pytest.raises(ConfigError, match=MODEL_ID):
        engine_from_name("embedded", "Qwen/Qwen3-1.7B")
    sim = engine_from_name("simulated", "m", 18124, ttft_ms=5.0, error_rate=0.1)
    assert sim.argv[:5] == (PY, "-m", "opentela", "engine", "simulated")
    assert set(sim.argv[5:]) >= {"--model", "m", "--port", "18124", "--ttft-ms", "5.0", "--error-rate", "0.1"}
    assert sim.ready_timeout < emb.ready_timeout
    with pytest.raises(ConfigError, match="ttft"):
        engine_from_name("simulated", ttft=5)


def test_build_custom_from_template() -> None:
    spec = engine_from_name("custom", "m1", 7002, command="my-server --model {model} --bind 127.0.0.1:{port}")
    assert spec.argv == ("my-server", "--model", "m1", "--bind", "127.0.0.1:7002")
    spec = engine_from_name("custom", None, None, command="x --port {port}", health_path="/health")
    assert spec.health_path == "/health" and spec.argv[-1] == str(spec.port)
    with pytest.raises(ConfigError, match="command"):
        engine_from_name("custom", "m")


def test_spec_is_immutable_and_validated() -> None:
    spec = EngineSpec("x", ["a", "b"], port=free_port(), env={"A": "1"})
    assert spec.argv == ("a", "b") and dict(spec.env) == {"A": "1"}
    with pytest.raises(TypeError):
        spec.env["B"] = "2"  # type: ignore[index]
    with pytest.raises(ConfigError):
        EngineSpec("x", [], port=1)
    with pytest.raises(ConfigError):
        EngineSpec("x", ["a"], port=70000)
    assert EngineSpec("x", ["a"], port=5, host="::1").base_url == "http://[::1]:5"


def test_free_ports_avoid_the_range_the_os_gives_to_port_zero_binds() -> None:
    """An engine port must not be one the node's own fabric listener (bound to port 0) can get a moment later."""
    import socket
    from pathlib import Path

    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = {free_port() for _ in range(20)}
    assert all(not (low <= p <= high) for p in ports), (low, high, sorted(ports))
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # each was free when returned, and nothing here took it since
