"""The BPRR problem: a model split into blocks, servers, clients, the network, placements, routes and their costs.

Notation follows Sun et al., "Optimizing resource allocation for geographically-distributed inference by large
language models" (Section 2.2, 3.1). Blocks are 0-based here: a server holding the paper's blocks
``{a_j, ..., a_j + m_j - 1}`` (1-based) has ``start = a_j - 1`` and ``end = start + m_j``, so its span is the
half-open range ``[start, end)``. Servers and clients are referred to by their index in the instance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

Objective = Literal["decode", "all_tokens"]
"""Per-token cost model: Eq. (4) (decoding tokens only) or Eq. (8) (averaged over all tokens, first included)."""

Matrix = tuple[tuple[float, ...], ...]


def _matrix(values: Sequence[Sequence[float]] | object, rows: int, cols: int, what: str) -> Matrix:
    """A rows x cols tuple matrix from nested sequences (or a numpy array); a scalar is broadcast."""
    if isinstance(values, int | float):
        return tuple(tuple(float(values) for _ in range(cols)) for _ in range(rows))
    out = tuple(tuple(float(v) for v in row) for row in values)  # type: ignore[attr-defined]
    if len(out) != rows or any(len(row) != cols for row in out):
        raise ValueError(f"{what} must be {rows}x{cols}, got {len(out)} rows")
    if any(v < 0 for row in out for v in row):
        raise ValueError(f"{what} has a negative entry")
    return out


@dataclass(frozen=True)
class ModelSpec:
    """An LLM as the planner sees it: L identical blocks, their size and the attention cache per session."""

    name: str
    n_blocks: int
    """L: decoder blocks to place."""
    block_bytes: int
    """s_m: bytes of one block's weights."""
    cache_bytes_per_token: int
    """Attention-cache bytes one token occupies in one block (keys and values)."""
    input_len: int = 20
    """l_max^I: maximum input tokens per request."""
    output_len: int = 128
    """l_max: maximum output tokens per request."""
    token_bytes: int = 0
    """Bytes of one hidden state sent between client and server (d_model x dtype bytes); 0 when unknown."""

    def __post_init__(self) -> None:
        if self.n_blocks < 1 or self.block_bytes <= 0 or self.cache_bytes_per_token < 0:
            raise ValueError(f"model {self.name}: need n_blocks >= 1, block_bytes > 0, cache bytes >= 0")
        if self.input_len < 1 or self.output_len < 1:
            raise ValueError(f"model {self.name}: input_len and output_len must be >= 1")

    @property
    def cache_bytes(self) -> int:
        """s_c: one block's attention cache for one session of l_max^I + l_max tokens."""
        return self.cache_bytes_per_token * (self.input_len + self.output_len)


@dataclass(frozen=True)
class ServerSpec:
    """A server: effective GPU memory M_j and per-block processing times (Section 2.2)."""

    name: str
    memory_bytes: int
    """M_j: memory for blocks and caches, after the CUDA context and fragmentation headroom."""
    tau_decode_s: float
    """tau_j: seconds per block per decoded token."""
    tau_prefill_s: float
    """tau_j^I(l_max^I): seconds per block to process a whole input."""
    gpu: str | None = None
    """Hardware label (catalog name), informational."""

    def __post_init__(self) -> None:
        if self.memory_bytes < 0 or self.tau_decode_s < 0 or self.tau_prefill_s < 0:
            raise ValueError(f"server {self.name}: memory and times must be non-negative")


@dataclass(frozen=True)
class Network:
    """Client->server round-trip times (seconds): per token t_cj and per input t^I_cj; [client][server]."""

    token_rtt_s: Matrix
    input_rtt_s: Matrix
    server_delay_s: Matrix | None = None
    """Optional one-way server->server delays, for direct forwarding (the Remark after Eq. (1))."""

    @property
    def n_clients(self) -> int:
        """Rows of the matrices."""
        return len(self.token_rtt_s)

    @property
    def n_servers(self) -> int:
        """Columns of the matrices."""
        return len(self.token_rtt_s[0]) if self.token_rtt_s else 0

    def worst_token_rtt(self, server: int) -> float:
        """t_{*j}: the largest per-token RTT from any client to `server` (Eq. 14)."""
        return max(row[server] for row in self.token_rtt_s)

    @classmethod
    def from_latency(
        cls,
        rtt_s: Sequence[Sequence[float]] | object,
        *,
        n_clients: int,
        n_servers: int,
        bandwidth_bps: Sequence[Sequence[float]] | float = 1e9,
        token_bytes: int = 0,
        input_len: int = 1,
        server_delay_s: Sequence[Sequence[float]] | None = None,
    ) -> Network:
        """Per-token and per-input RTTs from propagation RTTs plus transfer both ways at `bandwidth_bps`."""
        rtt = _matrix(rtt_s, n_clients, n_servers, "rtt_s")
        bw = _matrix(bandwidth_bps, n_clients, n_servers, "bandwidth_bps")
        if any(b <= 0 for row in bw for b in row):
            raise ValueError("bandwidth_bps must be positive")
        # One hidden state goes to the server and one comes back per token; a whole input both ways for prefill.
        token = tuple(
            tuple(r + 2 * token_bytes * 8 / b for r, b in zip(rr, br, strict=True))
            for rr, br in zip(rtt, bw, strict=True)
        )
        inp = tuple(
            tuple(r + 2 * input_len * token_bytes * 8 / b for r, b in zip(rr, br, strict=True))
            for rr, br in zip(rtt, bw, strict=True)
        )
        delays = (
            None
            if server_delay_s is None
            else _matrix(server_delay_s, n_servers, n_servers, "server_delay_s")
        )
        return cls(token_rtt_s=token, input_rtt_s=inp, server_delay_s=delays)


@dataclass(frozen=True)
class Instance:
    """One BPRR instance: the model, servers, clients, network and the requests each client sends."""

    model: ModelSpec
    servers: tuple[ServerSpec, ...]
    clients: tuple[str, ...]
    network: Network
    requests_per_client: tuple[int, ...]
    """|R_c| for each client (offline), or the concurrency each client is planned for (online)."""

    def __post_init__(self) -> None:
        if not self.servers or not self.clients:
            raise ValueError("an instance needs at least one server and one client")
        if self.network.n_clients != len(self.clients) or self.network.n_servers != len(self.servers):
            raise ValueError(
                f"network is {self.network.n_clients}x{self.network.n_servers}, "
                f"instance has {len(self.clients)} clients x {len(self.servers)} servers"
            )
        if len(self.requests_per_client) != len(self.clients) or min(self.requests_per_client) < 0:
            raise ValueError("requests_per_client needs one non-negative count per client")

    @property
    def n_requests(self) -> int:
        """|R|: requests over all clients."""
        return sum(self.requests_per_client)

    def request_clients(self) -> tuple[int, ...]:
        """The client index of every request, requests of client 0 first."""
        return tuple(c for c, n in enumerate(self.requests_per_client) for _ in range(n))


@dataclass(frozen=True)
class Placement:
    """Contiguous block ranges per server: server j holds [starts[j], starts[j] + counts[j]); count 0 = unused."""

    n_blocks: int
    starts: tuple[int, ...]
    counts: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.starts) != len(self.counts):
            raise ValueError("starts and counts differ in length")
        for j, (a, m) in enumerate(zip(self.starts, self.counts, strict=True)):
            if m < 0 or a < 0 or a + m > self.n_blocks:
                raise ValueError(f"server {j}: span [{a}, {a + m}) outside [0, {self.n_blocks})")

    def span(self, server: int) -> tuple[int, int]:
        """The half-open block range [start, end) held by `server`."""
        return self.starts[server], self.starts[server] + self.counts[server]

    def paper_first_block(self, server: int) -> int:
        """a_j in the paper's 1-based numbering."""
        return self.starts[server] + 1

    def hosts(self, server: int, block: int) -> bool:
        """Whether `server` holds `block`."""
        start, end = self.span(server)
        return start <= block < end

    def coverage(self) -> list[int]:
        """How many servers hold each block."""
        cover = [0] * self.n_blocks
        for start, m in zip(self.starts, self.counts, strict=True):
            for b in range(start, start + m):
                cover[b] += 1
        return cover

    def covers_all(self) -> bool:
        """Whether every block is held by at least one server (a feasible chain may exist)."""
        return all(self.coverage())

    def memory_used(self, server: int, model: ModelSpec, cache_blocks: int = 0) -> int:
        """Eq. (2): s_m m_j plus s_c for every (session, block) cache the server keeps."""
        return model.block_bytes * self.counts[server] + model.cache_bytes * cache_blocks


@dataclass(frozen=True)
class Hop:
    """One server on a chain and the blocks [first_block, end_block) it processes for the session."""

    server: int
    first_block: int
    end_block: int

    @property
    def n_blocks(self) -> int:
        """k_j: blocks this server processes (and keeps caches for)."""
        return self.end_block - self.first_block


@dataclass(frozen=True)
class Route:
    """A request's chain: its client and the ordered hops, which together process [0, L) once each."""

    client: int
    hops: tuple[Hop, ...]

    @property
    def servers(self) -> tuple[int, ...]:
        """Server indices in chain order."""
        return tuple(h.server for h in self.hops)


@dataclass(frozen=True)
class Routing:
    """One route per request (offline) or per active session (online)."""

    routes: tuple[Route, ...] = field(default=())

    def cache_blocks(self, server: int) -> int:
        """Sum over routes of the blocks `server` processes: the caches it must hold (Eq. 5)."""
        return sum(h.n_blocks for r in self.routes for h in r.hops if h.server == server)


# --- Route construction and feasibility (Lemma 3.1) -------------------------------------------------------------


def chain_is_feasible(placement: Placement, servers: Sequence[int]) -> bool:
    """Condition (3): after each server the next needed block is on the next server, and the chain ends at L."""
    reached = 0  # the S-client's dummy block: the next block needed is block 0
    for j in servers:
        start, end = placement.span(j)
        if not start <= reached < end:
            return False
        reached = end
    return reached == placement.n_blocks


def route_from_chain(placement: Placement, client: int, servers: Sequence[int]) -> Route:
    """The route through `servers`: each block is processed by the first server on the chain that holds it."""
    if not chain_is_feasible(placement, servers):
        raise ValueError(f"chain {list(servers)} is not feasible under the placement (Lemma 3.1)")
    hops: list[Hop] = []
    reached = 0
    for j in servers:
        end = placement.span(j)[1]
        hops.append(Hop(j, reached, end))
        reached = end
    return Route(client, tuple(hops))


def route_is_valid(placement: Placement, route: Route) -> bool:
    """Whether the route's hops are what the placement and the first-holder rule imply, covering [0, L)."""
    if not route.hops or not chain_is_feasible(placement, route.servers):
        return False
    return route == route_from_chain(placement, route.client, route.servers)


# --- Performance models: Eq. (1), (4), (8) -------------------------------------------------------------------------


def hop_token_time(instance: Instance, client: int, hop: Hop) -> float:
    """Eq. (4): t_cj + tau_j k_j, one decoding token's time at this hop."""
    server = instance.servers[hop.server]
    return instance.network.token_rtt_s[client][hop.server] + server.tau_decode_s * hop.n_blocks


def hop_first_token_time(instance: Instance, client: int, hop: Hop) -> float:
    """t^{c,I}_ij: t^I_cj + tau^I_j k_j, the prefill (first token) time at this hop."""
    server = instance.servers[hop.server]
    return instance.network.input_rtt_s[client][hop.server] + server.tau_prefill_s * hop.n_blocks


def hop_cost(instance: Instance, client: int, hop: Hop, objective: Objective = "decode") -> float:
    """A hop's per-token cost: Eq. (4), or Eq. (8) that spreads the first token's time over l_max tokens."""
    decode = hop_token_time(instance, client, hop)
    if objective == "decode":
        return decode
    n = instance.model.output_len
    return (hop_first_token_time(instance, client, hop) + (n - 1) * decode) / n


def route_token_time(instance: Instance, route: Route) -> float:
    """Per-token time of a decoding step along the route (second sum of Eq. 1)."""
    return sum(hop_token_time(instance, route.client, h) for h in route.hops)


def route_first_token_time(instance: Instance, route: Route) -> float:
    """Time to the first token along the route (first sum of Eq. 1)."""
    return sum(hop_first_token_time(instance, route.client, h) for h in route.hops)


def route_total_time(instance: Instance, route: Route) -> float:
    """Eq. (1): the whole session, one prefill then l_max - 1 decoding steps."""
    n = instance.model.output_len
    return route_first_token_time(instance, route) + (n - 1) * route_token_time(instance, route)


def route_cost(instance: Instance, route: Route, objective: Objective = "decode") -> float:
    """Per-token cost of a route under `objective` (sum of hop costs)."""
    return sum(hop_cost(instance, route.client, h, objective) for h in route.hops)


def mean_token_time(instance: Instance, routing: Routing, objective: Objective = "decode") -> float:
    """Objective (6a) divided by |R|: the average per-token time over the routed requests."""
    if not routing.routes:
        return 0.0
    return sum(route_cost(instance, r, objective) for r in routing.routes) / len(routing.routes)


# --- Memory: Eq. (5) and feasibility ---------------------------------------------------------------------------------


def server_memory(instance: Instance, placement: Placement, routing: Routing, server: int) -> int:
    """Eq. (5): block weights plus one cache per (session, processed block) at `server`."""
    return placement.memory_used(server, instance.model, routing.cache_blocks(server))


def memory_violations(instance: Instance, placement: Placement, routing: Routing | None = None) -> list[int]:
    """Servers whose memory (Eq. 5; Eq. 2 with no routing) exceeds M_j."""
    routing = routing or Routing()
    return [
        j
        for j, s in enumerate(instance.servers)
        if server_memory(instance, placement, routing, j) > s.memory_bytes
    ]


def solution_is_feasible(instance: Instance, placement: Placement, routing: Routing) -> bool:
    """A full offline solution: one valid route per request, from the right client, within every server's memory."""
    if len(placement.starts) != len(instance.servers) or placement.n_blocks != instance.model.n_blocks:
        return False
    if tuple(r.client for r in routing.routes) != instance.request_clients():
        return False
    if not all(route_is_valid(placement, r) for r in routing.routes):
        return False
    return not memory_violations(instance, placement, routing)
