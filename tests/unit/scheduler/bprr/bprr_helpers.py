"""Small BPRR instances for the tests: sizes in abstract units, times in seconds."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from opentela.scheduler.bprr import Instance, ModelSpec, Network, ServerSpec


def model(n_blocks: int, block_bytes: int = 10, cache_bytes: int = 2, output_len: int = 1) -> ModelSpec:
    """A model whose per-session cache per block is exactly `cache_bytes` (input 1 token + output_len)."""
    per_token, rest = divmod(cache_bytes, 1 + output_len)
    assert rest == 0, "cache_bytes must divide by 1 + output_len"
    return ModelSpec("toy", n_blocks, block_bytes, per_token, input_len=1, output_len=output_len)


def instance(
    spec: ModelSpec,
    memories: Sequence[int],
    taus: Sequence[float],
    rtts: Sequence[Sequence[float]],
    requests: Sequence[int],
    prefill: Sequence[float] | None = None,
    input_rtts: Sequence[Sequence[float]] | None = None,
) -> Instance:
    """An instance with one row of per-token RTTs per client."""
    servers = tuple(
        ServerSpec(f"s{j}", m, tau, tau if prefill is None else prefill[j])
        for j, (m, tau) in enumerate(zip(memories, taus, strict=True))
    )
    token = tuple(tuple(row) for row in rtts)
    net = Network(token, token if input_rtts is None else tuple(tuple(r) for r in input_rtts))
    return Instance(spec, servers, tuple(f"c{c}" for c in range(len(rtts))), net, tuple(requests))


@st.composite
def instances(draw: st.DrawFn, max_servers: int = 6, max_blocks: int = 8, max_clients: int = 3) -> Instance:
    """Random instances: heterogeneous memory (in blocks), speeds and RTTs, a few requests per client."""
    n_blocks = draw(st.integers(1, max_blocks))
    n_servers = draw(st.integers(1, max_servers))
    n_clients = draw(st.integers(1, max_clients))
    block, cache = 10, draw(st.sampled_from([0, 2, 4, 6]))
    spec = model(n_blocks, block, cache)
    memories = draw(st.lists(st.integers(0, 12 * n_blocks * block), min_size=n_servers, max_size=n_servers))
    taus = draw(st.lists(st.floats(0.001, 0.1), min_size=n_servers, max_size=n_servers))
    rtts = draw(
        st.lists(
            st.lists(st.floats(0.0, 0.3), min_size=n_servers, max_size=n_servers),
            min_size=n_clients,
            max_size=n_clients,
        )
    )
    requests = draw(st.lists(st.integers(0, 4), min_size=n_clients, max_size=n_clients))
    if sum(requests) == 0:
        requests[0] = 1
    return instance(spec, memories, taus, rtts, requests)
