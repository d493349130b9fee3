"""The paper's evaluation settings: BLOOM-176B sizes, A100/MIG servers, Table 2's clusters, scattered deployments."""

from __future__ import annotations

import numpy as np
import pytest

from opentela.scheduler.bprr import conservative_counts, petals_block_count
from opentela.scheduler.bprr.scenarios import (
    A100,
    MIG,
    PETALS_RESERVE_BYTES,
    SCATTERED_TOKEN_OVERHEAD_S,
    bloom176b,
    calibrated_setup,
    clustered,
    scattered,
)
from opentela.scheduler.bprr.topologies import table3_topology


@pytest.mark.parametrize("lmax", [64, 128])
def test_bloom_cache_is_equation_2(lmax: int) -> None:
    m = bloom176b(lmax)
    assert m.n_blocks == 70
    assert m.cache_bytes == 2 * 14336 * (20 + lmax) * 2  # s_c = 2 d_model (l^I + l) dtype_bytes
    assert 1.3e9 < m.block_bytes < 1.35e9  # 2.47e9 parameters in NF4
    assert m.token_bytes == 14336 * 2


def test_petals_places_53_blocks_on_an_a100_and_4_on_a_mig_as_the_paper_reports() -> None:
    inst = clustered(0).instance
    counts = [petals_block_count(inst, s, reserve_bytes=PETALS_RESERVE_BYTES) for s in inst.servers]
    assert counts == [53, 53] + [4] * 7


def test_cg_bp_trades_blocks_for_cache_as_planned_concurrency_grows() -> None:
    inst = clustered(0).instance
    a100 = [conservative_counts(inst, r)[0] for r in (1, 20, 80, 200)]
    assert a100 == sorted(a100, reverse=True) and a100[0] == 64 and a100[-1] < 40
    assert conservative_counts(inst, 90)[0] == 41  # the paper's "41 blocks on an A100" at |R| about 90


def test_clustered_rtts_follow_table_2_and_the_paper_s_0_12_s_inter_cluster_embedding() -> None:
    remote = clustered(0)
    assert remote.instance.network.token_rtt_s[0] == pytest.approx((0.12,) * 9)
    local_a100 = clustered(1).instance.network.token_rtt_s[0]
    assert local_a100[0] < 0.03 and local_a100[2] == pytest.approx(0.12)
    assert remote.server_ping_s[0][1] == 0.005 and remote.server_ping_s[0][2] == 0.100
    assert [k.name for k in remote.kinds].count(A100.name) == 2
    inp = remote.instance.network.input_rtt_s[0][0]
    assert inp > 0.12  # twenty embeddings take longer than one


def test_scattered_deployment_draws_servers_kinds_and_a_separate_client() -> None:
    rng = np.random.default_rng(5)
    sc = scattered("BellCanada", 26, 0.2, rng)
    topo = table3_topology("BellCanada")
    assert sc.n_servers == 26
    assert sum(k is A100 for k in sc.kinds) == 5 and sum(k is MIG for k in sc.kinds) == 21
    client = int(sc.instance.clients[0].removeprefix("node"))
    hosts = [int(s.name.split("@")[1]) for s in sc.instance.servers]
    assert client not in hosts and len(set(hosts)) == 26
    for j, h in enumerate(hosts):
        assert sc.client_ping_s[j] == pytest.approx(topo.rtt_s[client, h])
        transfer = 2 * sc.instance.model.token_bytes * 8 / 1e9
        assert sc.instance.network.token_rtt_s[0][j] == pytest.approx(
            topo.rtt_s[client, h] + transfer + SCATTERED_TOKEN_OVERHEAD_S
        )
    with pytest.raises(ValueError):
        scattered("AboveNet", 23, 0.2, rng)  # no node left for the client


def test_output_length_changes_the_cache_not_the_times() -> None:
    sc = clustered(2, 64)
    longer = sc.with_output_len(128)
    assert longer.instance.model.cache_bytes > sc.instance.model.cache_bytes
    assert longer.instance.network == sc.instance.network and longer.instance.servers == sc.instance.servers


def test_calibrated_setup_is_the_authors_constants() -> None:
    assert calibrated_setup("proposed").total_s == pytest.approx(60.07)
    assert calibrated_setup("petals").total_s == pytest.approx(250.07)
