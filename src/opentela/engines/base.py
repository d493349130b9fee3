"""The engine contract: an `EngineSpec` says how to run and reach one engine, an `Engine` builds it."""

from __future__ import annotations

import abc
import math
import os
import random
import shlex
import socket
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from opentela.engines.advertised import (
    ADVERTISED_KEYS,
    CONTEXT_LENGTH,
    MAX_COUNT,
    QUANTIZATION,
    clean_settings,
    normalise_quantization,
)
from opentela.errors import ConfigError

LOOPBACK = "127.0.0.1"
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})


@dataclass(frozen=True)
class EngineSpec:
    """Everything needed to start an engine process and to talk to it once it is up."""

    name: str
    """Registry name of the adapter that produced this spec (``vllm``, ``embedded``, ...)."""
    argv: tuple[str, ...]
    """The full command line; the supervisor runs it as is, without a shell."""
    _: KW_ONLY
    port: int
    """The local port the engine serves the OpenAI API on."""
    host: str = LOOPBACK
    """The address the node connects to (a wildcard bind address is reached through loopback)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables, laid over the node's own environment."""
    health_path: str = "/v1/models"
    """GET path that answers 200 with a non-empty ``data`` list once the engine serves."""
    ready_timeout: float = 600.0
    """Seconds to wait for the engine to become ready (large models load slowly)."""
    unix_socket: str | None = None
    """A Unix socket the engine also serves on: the node's requests go there (a cheaper hop than TCP)."""

    def __post_init__(self) -> None:
        # Accept lists and dicts from callers but keep the spec immutable and safe to share.
        object.__setattr__(self, "argv", tuple(str(a) for a in self.argv))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        if not self.argv:
            raise ConfigError("an engine command cannot be empty")
        if not 0 < self.port < 65536:
            raise ConfigError(f"engine port must be in 1..65535, got {self.port}")

    @property
    def base_url(self) -> str:
        """The engine's root URL, e.g. ``http://127.0.0.1:8000``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def command_line(self) -> str:
        """The command as a shell-quoted string, for logs and status output."""
        return shlex.join(self.argv)


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port that is free on `host` right now, outside the range the OS gives to port-0 binds.

    A port the OS picked for a probe socket and got back is among the next it may hand to any socket bound to
    port 0, such as the node's own fabric listener started a moment later; the engine then cannot bind it. Ports
    below (or above) the ephemeral range are never handed out that way, so those are tried first.
    """
    low, high = _ephemeral_range()
    spans = [(max(1024, low - 20000), low - 1)] if low > 2048 else []
    if high < 65000:
        spans.append((high + 1, 65535))
    rng = random.Random()
    for first, last in spans:
        for _ in range(64):
            port = rng.randint(first, last)
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def engine_socket_path(engine: str, port: int) -> str:
    """Where an engine of this host serving on `port` puts its Unix socket: a per-user folder, as other users'
    files in a shared temporary folder could squat the name."""
    base = os.environ.get("XDG_RUNTIME_DIR") or os.path.join(tempfile.gettempdir(), f"otela-{os.getuid()}")
    return os.path.join(base, f"otela-{engine}-{port}.sock")


def prepare_socket_path(path: str) -> str | None:
    """Make a Unix socket's folder (private to this user) and clear a stale socket a killed run left there;
    None, with a note on stderr, when that fails (the engine then serves on TCP only)."""
    try:
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        if os.path.exists(path) and stat.S_ISSOCK(os.stat(path).st_mode):
            os.unlink(path)
    except OSError as exc:
        print(f"not serving on Unix socket {path}: {exc}; TCP only", file=sys.stderr)
        return None
    return path


def as_argv(command: str | Sequence[str]) -> list[str]:
    """Split a command given as one string the way a POSIX shell would; copy a sequence."""
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def find_flag(argv: Sequence[str], flag: str) -> str | None:
    """Return the value of the last ``flag V`` or ``flag=V`` in argv (later flags win, as in argparse)."""
    value: str | None = None
    for i, tok in enumerate(argv):
        if tok == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif tok.startswith(flag + "="):
            value = tok[len(flag) + 1 :]
    return value


def program_index(argv: Sequence[str], names: Sequence[str], then: str | None = None) -> int | None:
    """Index of the first token whose basename is one of `names` (optionally followed by `then`).

    Scanning the whole line, not only argv[0], recognises engines behind launchers such as
    ``srun``, ``uv run`` or ``apptainer exec IMAGE``.
    """
    for i, tok in enumerate(argv):
        if os.path.basename(tok) in names and (then is None or (i + 1 < len(argv) and argv[i + 1] == then)):
            return i
    return None


def module_index(argv: Sequence[str], prefixes: Sequence[str]) -> int | None:
    """Index of the module name after ``-m`` when it starts with one of `prefixes`."""
    for i, tok in enumerate(argv[:-1]):
        if tok == "-m" and any(argv[i + 1] == p or argv[i + 1].startswith(p + ".") for p in prefixes):
            return i + 1
    return None


def runs_otela_engine(argv: Sequence[str], engine: str) -> bool:
    """True for ``otela engine ENGINE ...`` and ``python -m opentela engine ENGINE ...`` (behind any launcher)."""
    i = module_index(argv, ("opentela",))
    if i is None:
        i = program_index(argv, ("otela",))
    return i is not None and list(argv[i + 1 : i + 3]) == ["engine", engine]


def parse_port(value: str, where: str) -> int:
    """Parse a port number found in a command line, with an error that points at it."""
    try:
        port = int(value)
    except ValueError:
        raise ConfigError(f"invalid port {value!r} in {where}") from None
    if not 0 <= port < 65536:
        raise ConfigError(f"port {port} out of range in {where}")
    return port


class Engine(abc.ABC):
    """Knows one engine: how to recognise its command, where it listens, and how to build its command.

    Subclasses set the class attributes and implement `matches` and `build`; `from_command` is shared.
    """

    name: ClassVar[str] = ""
    default_port: ClassVar[int | None] = None
    """Where the engine listens when its command names no port (None: unknown)."""
    port_flag: ClassVar[str | None] = "--port"
    """The flag that sets the port; None when the port cannot be set on the command line."""
    host_flag: ClassVar[str | None] = "--host"
    health_path: ClassVar[str] = "/v1/models"
    ready_timeout: ClassVar[float] = 600.0
    uds_flag: ClassVar[str | None] = None
    """The flag that makes the engine serve on a Unix socket as well as its port (None: it cannot)."""
    native_responses: ClassVar[bool] = False
    """Whether the engine serves the OpenAI Responses API (``/v1/responses``) itself."""
    report_paths: ClassVar[tuple[str, ...]] = ()
    """GET paths, besides ``/v1/models``, whose JSON answers `reported_settings` reads once the engine serves."""

    @abc.abstractmethod
    def matches(self, argv: Sequence[str]) -> bool:
        """True when argv runs this engine."""

    @abc.abstractmethod
    def build(self, model: str | None, port: int | None, **options: Any) -> EngineSpec:
        """The command that serves `model` on `port` (None or 0: a free port) with engine options."""

    def from_command(self, argv: str | Sequence[str], port: int | None = None) -> EngineSpec:
        """Wrap a user's command: find its port, or add a port flag when the command names none."""
        args = as_argv(argv)
        if any("{port}" in a for a in args):
            # A template (from a controller or a config file) leaves the port to us and says where it goes.
            port = port or free_port()
            args = [a.replace("{port}", str(port)) for a in args]
            return self.spec(self._with_socket(args, port), port)
        where = f"`{shlex.join(args)}`"
        found = find_flag(args, self.port_flag) if self.port_flag else None
        chosen = parse_port(found, where) if found is not None else None
        if chosen and port and chosen != port:
            raise ConfigError(f"the command listens on port {chosen} but port {port} was requested: {where}")
        if not chosen:
            chosen = self._choose_port(args, port, where)
        return self.spec(self._with_socket(args, chosen), chosen)

    def _with_socket(self, args: list[str], port: int) -> list[str]:
        # An engine that can serve on a Unix socket beside its port gets one unless its command names one.
        if self.uds_flag is not None and find_flag(args, self.uds_flag) is None:
            return [*args, self.uds_flag, engine_socket_path(self.name, port)]
        return args

    def _choose_port(self, args: list[str], port: int | None, where: str) -> int:
        # `--port 0` and no port at all both mean "pick one for me" when the flag is known.
        if self.port_flag is not None:
            chosen = port or free_port()
            found = find_flag(args, self.port_flag)
            if found is not None:
                _replace_flag(args, self.port_flag, str(chosen))
            else:
                args += [self.port_flag, str(chosen)]
            return chosen
        if port:
            return port
        if self.default_port is not None:
            return self.default_port
        raise ConfigError(f"cannot tell which port {where} serves on; pass the port explicitly")

    def _reach_host(self, args: Sequence[str]) -> str:
        host = find_flag(args, self.host_flag) if self.host_flag else None
        if host is None or host in _WILDCARD_HOSTS:
            return LOOPBACK
        return host.strip("[]")

    def spec(self, argv: Sequence[str], port: int, *, env: Mapping[str, str] | None = None) -> EngineSpec:
        """An EngineSpec for this engine's argv that serves on `port`."""
        return EngineSpec(
            self.name,
            tuple(argv),
            port=port,
            host=self._reach_host(argv),
            env=env or {},
            health_path=self.health_path,
            ready_timeout=self.ready_timeout,
            unix_socket=(find_flag(argv, self.uds_flag) or None) if self.uds_flag else None,
        )

    def launch_settings(self, argv: Sequence[str]) -> dict[str, Any]:
        """What the command line says the engine serves with (``engines.advertised`` names); {} by default."""
        return {}

    def reported_settings(self, reports: Mapping[str, Any]) -> dict[str, Any]:
        """What the engine says of itself, from the parsed answers to `report_paths` (keyed by path; a path that
        did not answer is missing). Never raises: odd or missing fields are simply not advertised."""
        return {}

    def model_file(self, argv: Sequence[str], reports: Mapping[str, Any]) -> str | None:
        """The local GGUF file the engine serves, whose header says its quantization; None when there is none."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} default_port={self.default_port}>"


def _replace_flag(args: list[str], flag: str, value: str) -> None:
    for i, tok in enumerate(args):
        if tok == flag and i + 1 < len(args):
            args[i + 1] = value
        elif tok.startswith(flag + "="):
            args[i] = f"{flag}={value}"


def options_to_flags(options: Mapping[str, Any], flags: Mapping[str, str], engine: str) -> list[str]:
    """Turn keyword options into command-line flags using a name -> flag table.

    None skips an option, True adds a bare flag, False drops it, a list or tuple repeats the values
    after one flag; an option missing from the table is a configuration error naming the known ones.
    """
    out: list[str] = []
    for key, value in options.items():
        flag = flags.get(key)
        if flag is None:
            known = ", ".join(sorted(flags))
            raise ConfigError(f"unknown option {key!r} for engine {engine!r}; known options: {known}")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, list | tuple):
            out += [flag, *(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out


def advertised_settings(entry: Mapping[str, Any]) -> dict[str, Any]:
    """Settings worth putting in the registry from one ``/v1/models`` entry of an engine.

    vLLM and SGLang report ``max_model_len``, llama.cpp's server ``meta.n_ctx`` (and, in some builds,
    ``meta.ftype``); the simulated engine (and any engine that wants to) adds an ``otela`` object with more
    (``gpu``, ``quantization``, ``throughput``...). Only plain scalars are kept; the names
    `opentela.engines.advertised` knows are normalised, and dropped when they do not normalise.
    """
    out: dict[str, Any] = {}
    meta = entry.get("meta")
    meta = meta if isinstance(meta, Mapping) else {}
    window = entry.get("max_model_len", meta.get("n_ctx"))
    if isinstance(window, int) and not isinstance(window, bool) and 0 < window < MAX_COUNT:
        out[CONTEXT_LENGTH] = window
    quantization = normalise_quantization(meta.get("ftype"))
    if quantization:
        out[QUANTIZATION] = quantization
    extra = entry.get("otela")
    if isinstance(extra, Mapping):
        for key, value in list(extra.items())[:16]:
            if isinstance(key, str) and len(key) <= 64 and _plain_scalar(value):
                out[key] = value[:128] if isinstance(value, str) else value
    known = {k: out.pop(k) for k in ADVERTISED_KEYS if k in out}
    return {**out, **clean_settings(known)}


def _plain_scalar(value: Any) -> bool:
    """A value every peer's record schema takes: text, a boolean, an integer or finite float JSON holds exactly."""
    if isinstance(value, bool | str):
        return True
    if isinstance(value, int):
        return -(2**53) < value < 2**53
    return isinstance(value, float) and math.isfinite(value)
