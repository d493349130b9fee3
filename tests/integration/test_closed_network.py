"""A closed network of real `otela start` processes: members serve, outsiders are refused and never show up."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from opentela._types import PROTO_GOSSIP, Lifecycle
from opentela.cli.localmesh import OTELA, LocalMesh
from opentela.errors import AdmissionError
from opentela.fabric.admission import Admission
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity
from opentela.fabric.join_tokens import JoinToken
from opentela.fabric.messages import write_msg
from opentela.registry.record import ModelEntry, NodeRecord

pytestmark = pytest.mark.integration

SIM = [*OTELA, "engine", "simulated", "--model", "sim", "--ttft-ms", "1"]


def otela(*args: str) -> str:
    """Run an `otela` command to completion; its standard output."""
    done = subprocess.run([*OTELA, *args], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def issue(key: Path, provider: str, directory: Path) -> Path:
    path = directory / f"{provider}.token"
    path.write_text(otela("network", "issue", "--key", str(key), "--provider", provider, "--expires", "1d"))
    return path


def forged(identity: Identity, membership: bytes, addr: str) -> NodeRecord:
    """A SERVING record of `sim` signed by `identity` (validly), with the given membership proof."""
    now = time.time()
    return NodeRecord(
        session_id=uuid.uuid4().hex,
        peer_id=identity.peer_id,
        provider_id="lab-x",
        lifecycle=Lifecycle.SERVING,
        version=1,
        addrs=(addr,),
        models=(ModelEntry("sim", "simulated"),),
        started_at=now,
        updated_at=now,
        membership=membership,
    ).signed(identity)


async def test_only_members_join_a_closed_network(tmp_path: Path) -> None:
    key = tmp_path / "network.key"
    network_id = otela("network", "init", "--out", str(key))
    assert network_id.startswith("otn_") and key.stat().st_mode & 0o077 == 0
    other_key = tmp_path / "other.key"
    otela("network", "init", "--out", str(other_key))
    tokens = {p: issue(key, p, tmp_path) for p in ("ingress", "lab-a", "lab-x")}
    foreign = issue(other_key, "lab-c", tmp_path)

    async with LocalMesh(tmp_path) as mesh:
        ingress = await mesh.start_ingress(
            "--join-token-file", str(tokens["ingress"]), "--network-id", network_id
        )
        await mesh.add_worker("worker-a", SIM, "--join-token-file", str(tokens["lab-a"]), provider="lab-a")
        await mesh.wait_serving("sim", 1, timeout=60)
        async with mesh.http().post(
            f"{mesh.api}/chat/completions",
            json={"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        ) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["choices"][0]["message"]["content"]
        assert f"closed network {network_id}" in ingress.log_text()

        # No token, and a token of another network: both refused during the handshake, with the reason.
        outsider = await mesh.add_worker("worker-b", SIM, provider="lab-b")
        stranger = await mesh.add_worker(
            "worker-c", None, "--join-token-file", str(foreign), provider="lab-c"
        )

        async def refused() -> bool:
            return (
                "did not admit us" in outsider.log_text()
                and "is a member of network" in stranger.log_text()
                and "refused inbound peer" in ingress.log_text()  # worker-b: the ingress refuses it
                and "refused us" in ingress.log_text()  # worker-c refuses the ingress first
            )

        await mesh.wait_for(refused, timeout=60, what="the ingress to refuse both outsiders")
        assert "open network: any peer may join" in outsider.log_text()
        assert "no membership proof" in outsider.log_text()

        # A member relays forged records over gossip: one from a non-member, one with another network's proof.
        insider = await Host.create(
            Identity.generate(),
            admission=Admission.closed(JoinToken.decode(tokens["lab-x"].read_text()), Identity.generate()),
        )
        try:
            with pytest.raises(AdmissionError, match="made for another node"):
                await insider.connect(mesh.bootstrap)  # a proof for one node key cannot be shown by another
        finally:
            await insider.aclose()
        identity = Identity.generate()
        insider = await Host.create(
            identity, admission=Admission.closed(JoinToken.decode(tokens["lab-x"].read_text()), identity)
        )
        try:
            ingress_peer = await insider.connect(mesh.bootstrap)
            nobody, alien = Identity.generate(), Identity.generate()
            alien_proof = Admission.closed(JoinToken.decode(foreign.read_text()), alien).proof
            records = [forged(nobody, b"", "127.0.0.1:9"), forged(alien, alien_proof, "127.0.0.1:9")]
            stream = await insider.open_stream(ingress_peer, PROTO_GOSSIP)
            await write_msg(stream, {"t": "push", "r": [r.to_wire() for r in records]})
            await stream.write_eof()

            async def dropped() -> bool:
                stats = await mesh.get_json("/dnt/stats")
                return bool(stats) and stats["registry"].get("rejected_not_member", 0) >= 2

            await mesh.wait_for(dropped, timeout=30, what="the ingress to drop the forged records")
        finally:
            await insider.aclose()

        table = await mesh.get_json("/dnt/table")
        providers = {r["provider_id"] for r in table}
        assert providers == {"ingress", "lab-a"}, providers
        assert {r["peer_id"] for r in table}.isdisjoint({nobody.peer_id, alien.peer_id})
        replicas = await mesh.replicas("sim")
        assert [r["provider_id"] for r in replicas] == ["lab-a"], replicas
        stats = await mesh.get_json("/dnt/stats")
        assert stats["admission"]["network_id"] == network_id
        assert stats["admission"]["refused_peers"] >= 2


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A network key, its id, another network's id and a token for lab-a, made with the real CLI."""
    workdir = tmp_path_factory.mktemp("network")
    key = workdir / "network.key"
    return {
        "NET": otela("network", "init", "--out", str(key)),
        "OTHER": otela("network", "init", "--out", str(workdir / "other.key")),
        "TOKEN": str(issue(key, "lab-a", workdir)),
    }


def test_show_token_decodes_without_the_secret(network: dict[str, str]) -> None:
    text = Path(network["TOKEN"]).read_text()
    shown = json.loads(otela("network", "show-token", text))
    assert shown["provider_id"] == "lab-a" and shown["network_id"] == network["NET"]
    assert shown["expired"] is False and text[20:60] not in json.dumps(shown)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--network-id", "NET"], "needs a join token"),
        (
            ["--join-token-file", "TOKEN", "--provider-id", "someone-else"],
            "join token is for provider 'lab-a'",
        ),
        (["--join-token-file", "TOKEN", "--network-id", "OTHER"], "is for network"),
        (["--join-token", "otjoin1_garbage"], "bad join token"),
    ],
)
def test_a_node_with_bad_admission_settings_does_not_start(
    tmp_path: Path, network: dict[str, str], args: list[str], needle: str
) -> None:
    argv = [*OTELA, "start", "--key-file", str(tmp_path / "node.key"), "--listen", "127.0.0.1:0"]
    done = subprocess.run(
        [*argv, *(network.get(a, a) for a in args)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and needle in done.stderr, done.stderr
