"""The placement policies of the LLM-Mesh evaluation by name: `llm-mesh`, `sllm` and `sllm+cpu`."""

from __future__ import annotations

from collections.abc import Mapping

from opentela.errors import ConfigError
from opentela.scheduler.llm_mesh.cluster import ServingPolicy
from opentela.scheduler.llm_mesh.mesh_policy import LlmMeshPolicy
from opentela.scheduler.llm_mesh.sllm_policy import SllmPolicy

POLICY_NAMES = ("llm-mesh", "sllm", "sllm+cpu")


def make_policy(name: str, sizes: Mapping[int, str]) -> ServingPolicy:
    """A fresh policy for one run; `sizes` maps each model index to "3B", "7B" or "13B"."""
    if name == "llm-mesh":
        return LlmMeshPolicy()
    if name == "sllm":
        return SllmPolicy(sizes)
    if name == "sllm+cpu":
        return SllmPolicy(sizes, use_cpu=True)
    raise ConfigError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
