"""The Kubernetes examples in deploy/k8s parse, hang together, and set only settings that exist."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from opentela.config import env_name, iter_fields

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
CLI = Path(__file__).resolve().parents[2] / "src" / "opentela" / "cli"


def documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in documents() if d["kind"] == kind]


def containers() -> list[dict[str, Any]]:
    return [c for d in by_kind("Deployment") for c in d["spec"]["template"]["spec"]["containers"]]


def test_every_file_parses_into_named_objects() -> None:
    docs = documents()
    assert {d["kind"] for d in docs} >= {"Namespace", "Deployment", "Service", "Kustomization"}
    for d in docs:
        assert d["apiVersion"] and d["kind"]
        if d["kind"] != "Kustomization":
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", d["metadata"]["name"])


def test_kustomization_lists_every_manifest() -> None:
    (kustomization,) = by_kind("Kustomization")
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"
    )


def test_deployments_select_their_own_pods() -> None:
    for d in by_kind("Deployment"):
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert d["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_services_reach_named_container_ports() -> None:
    deployments = by_kind("Deployment")
    for svc in by_kind("Service"):
        pods = [
            d
            for d in deployments
            if svc["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert pods, f"service {svc['metadata']['name']} selects no deployment"
        names = {
            p["name"] for d in pods for c in d["spec"]["template"]["spec"]["containers"] for p in c["ports"]
        }
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= names


def test_workers_bootstrap_through_the_bootstrap_service() -> None:
    services = {s["metadata"]["name"]: s for s in by_kind("Service")}
    (worker,) = [c for c in containers() if c["command"][:2] == ["otela", "start"] and "--" in c["command"]]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    host, _, port = env["OTELA_NODE_BOOTSTRAP"].partition(":")
    name, namespace = host.split(".")[:2]
    assert name in services and services[name]["metadata"]["namespace"] == namespace
    assert int(port) in {p["port"] for p in services[name]["spec"]["ports"]}
    assert worker["resources"]["limits"]["nvidia.com/gpu"] >= 1


def test_every_otela_variable_is_a_real_setting() -> None:
    """Each OTELA_* variable is in the configuration reference, or one `otela` reads itself (logging)."""
    settings = {env_name(section, f.name) for section, f, _ in iter_fields()}
    cli_source = "".join(path.read_text() for path in CLI.glob("*.py"))
    read_by_cli = set(re.findall(r'os\.environ\.get\("(OTELA_[A-Z_]+)"', cli_source))
    used = {e["name"] for c in containers() for e in c.get("env", []) if e["name"].startswith("OTELA_")}
    assert used, "the examples configure nodes through OTELA_* variables"
    unknown = used - settings - read_by_cli
    assert not unknown, f"not settings: {sorted(unknown)}"


@pytest.mark.parametrize("name", ["OTELA_NODE_HEALTH_INTERVAL", "OTELA_NODE_LOG_SINK"])
def test_the_worker_example_shows_fail_stop_settings(name: str) -> None:
    assert any(e["name"] == name for c in containers() for e in c.get("env", []))


def test_the_example_settings_load() -> None:
    """The values themselves are valid: the configuration loader accepts each container's environment."""
    from opentela.config import load_config

    for container in containers():
        env = {
            e["name"]: e["value"].replace("$(POD_IP)", "10.1.2.3")
            for e in container.get("env", [])
            if e["name"].startswith("OTELA_") and "value" in e
        }
        config = load_config(env=env)
        assert config.node.listen == "0.0.0.0:4001"
        assert config.node.advertise == ("10.1.2.3:4001",)
