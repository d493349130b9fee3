"""Read a pipeline description (servers, model, clients, RTTs) from YAML/JSON into a BPRR `Instance`.

```yaml
model: Llama-2-13b            # catalog name or config.json path
input_len: 20                 # l_max^I (default 20)
output_len: 128               # l_max (default 128)
servers:
  - {name: big, gpu: A100-80G}                                      # memory and times from the catalogs
  - {name: small, memory_gib: 9.5, tau_decode_ms: 12, tau_prefill_ms: 40}
clients: [ingress]            # default: one client, "client"
requests: 4                   # |R|: one count for every client, or {client: count}
rtt_ms: 50                    # scalar, or {client: {server: ms}}; --rtt FILE overrides it
bandwidth_mbps: 100           # client<->server bandwidth for hidden states (default 1000)
```

An RTT file (what the fabric's probes measure) is YAML/JSON ``{client: {server: ms}}`` (optionally under
``rtt_ms``), or a CSV whose header names the servers and whose first column names the clients.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from opentela.errors import ConfigError
from opentela.scheduler.bprr.catalog import block_model, server_from_device
from opentela.scheduler.bprr.problem import Instance, Network, ServerSpec
from opentela.scheduler.hardware import HardwareCatalog
from opentela.scheduler.models import load_model
from opentela.scheduler.roofline import Precision

GIB = 1024**3
RttTable = dict[str, dict[str, float]]


def _read(path: str | Path) -> Any:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(
            f"{path} is not valid {'JSON' if str(path).endswith('.json') else 'YAML'}: {exc}"
        ) from None


def load_rtt_file(path: str | Path) -> RttTable:
    """RTTs in milliseconds, {client: {server: ms}}, from YAML, JSON or CSV."""
    if str(path).endswith(".csv"):
        try:
            rows = list(csv.reader(io.StringIO(Path(path).read_text())))
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
        if len(rows) < 2 or len(rows[0]) < 2:
            raise ConfigError(f"{path}: expected a header row of servers and one row per client")
        servers = [s.strip() for s in rows[0][1:]]
        return {
            row[0].strip(): _rtt_row(dict(zip(servers, row[1:], strict=False)), f"{path}") for row in rows[1:]
        }
    doc = _read(path)
    doc = doc.get("rtt_ms", doc) if isinstance(doc, Mapping) else doc
    return rtt_table(doc, str(path))


def _rtt_row(row: Mapping[str, Any], where: str) -> dict[str, float]:
    try:
        out = {str(k): float(v) for k, v in row.items()}
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: RTTs must be numbers of milliseconds") from None
    if any(v < 0 for v in out.values()):
        raise ConfigError(f"{where}: negative RTT")
    return out


def rtt_table(doc: Any, where: str) -> RttTable:
    """`doc` ({client: {server: ms}}) checked and as floats; a ConfigError names `where` when it is malformed."""
    if not isinstance(doc, Mapping) or not all(isinstance(v, Mapping) for v in doc.values()):
        raise ConfigError(f"{where}: RTTs must map each client to {{server: milliseconds}}")
    return {str(c): _rtt_row(row, where) for c, row in doc.items()}


def _server(raw: Any, k: int, catalog: HardwareCatalog, ctx: dict[str, Any]) -> ServerSpec:
    if not isinstance(raw, Mapping) or "name" not in raw:
        raise ConfigError(f"servers[{k}]: each server needs at least a name")
    name = str(raw["name"])
    try:
        if "tau_decode_ms" in raw:
            if "memory_gib" not in raw:
                raise ConfigError(f"server {name}: give memory_gib with tau_decode_ms")
            decode = float(raw["tau_decode_ms"]) / 1000
            prefill = float(raw.get("tau_prefill_ms", raw["tau_decode_ms"])) / 1000
            return ServerSpec(name, int(float(raw["memory_gib"]) * GIB), decode, prefill, gpu=raw.get("gpu"))
        if "gpu" not in raw:
            raise ConfigError(
                f"server {name}: give a gpu from the hardware catalog, or memory_gib and tau_decode_ms"
            )
        device = catalog[str(raw["gpu"])]
        server = server_from_device(
            name, device, ctx["spec"], ctx["model"], ctx["precision"], ctx["mem_util"]
        )
        if "memory_gib" in raw:
            server = ServerSpec(
                name,
                int(float(raw["memory_gib"]) * GIB),
                server.tau_decode_s,
                server.tau_prefill_s,
                device.name,
            )
        return server
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"server {name}: {exc}") from None


def load_pipeline(
    path: str | Path,
    catalog: HardwareCatalog,
    *,
    precision: Precision | None = None,
    mem_util: float = 0.9,
    rtt: RttTable | None = None,
    requests: int | None = None,
) -> Instance:
    """Build the instance the file describes; `rtt` (from `load_rtt_file`) and `requests` override the file."""
    doc = _read(path)
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{path}: expected a mapping with model and servers")
    if "model" not in doc or not doc.get("servers"):
        raise ConfigError(f"{path}: needs 'model' and a non-empty 'servers' list")
    try:
        input_len, output_len = int(doc.get("input_len", 20)), int(doc.get("output_len", 128))
        bandwidth = float(doc.get("bandwidth_mbps", 1000)) * 1e6
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: input_len, output_len and bandwidth_mbps must be numbers") from None
    spec = load_model(str(doc["model"]))
    precision = precision or Precision()
    try:
        model = block_model(spec, precision, input_len=input_len, output_len=output_len)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    ctx = {"spec": spec, "model": model, "precision": precision, "mem_util": mem_util}
    servers = tuple(_server(raw, k, catalog, ctx) for k, raw in enumerate(doc["servers"]))
    names = [s.name for s in servers]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: server names must be unique")
    clients = tuple(str(c) for c in doc.get("clients", ["client"]))
    table = rtt if rtt is not None else _file_rtts(doc.get("rtt_ms", 50), clients, names, str(path))
    matrix = []
    for c in clients:
        if c not in table:
            raise ConfigError(f"no RTTs for client {c!r} (have: {', '.join(table) or 'none'})")
        missing = [s for s in names if s not in table[c]]
        if missing:
            raise ConfigError(f"no RTT from client {c!r} to server(s) {', '.join(missing)}")
        matrix.append([table[c][s] / 1000 for s in names])
    counts = _requests(doc.get("requests", 1) if requests is None else requests, clients, str(path))
    net = Network.from_latency(
        matrix,
        n_clients=len(clients),
        n_servers=len(servers),
        bandwidth_bps=bandwidth,
        token_bytes=model.token_bytes,
        input_len=input_len,
    )
    return Instance(model, servers, clients, net, counts)


def _file_rtts(raw: Any, clients: tuple[str, ...], servers: list[str], where: str) -> RttTable:
    if isinstance(raw, int | float):
        return {c: dict.fromkeys(servers, float(raw)) for c in clients}
    return rtt_table(raw, where)


def _requests(raw: Any, clients: tuple[str, ...], where: str) -> tuple[int, ...]:
    try:
        if isinstance(raw, Mapping):
            counts = tuple(int(raw.get(c, 0)) for c in clients)
        else:
            counts = (int(raw),) * len(clients)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: requests must be a count or {{client: count}}") from None
    if min(counts) < 0 or sum(counts) == 0:
        raise ConfigError(f"{where}: requests must be non-negative with at least one in all")
    return counts
