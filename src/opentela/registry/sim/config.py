"""What one simulation runs: the number of nodes, the overlay, the registry and fabric settings, the links."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from opentela.fabric._config import FabricConfig
from opentela.registry._config import RegistryConfig
from opentela.registry.sim.network import LinkModel

Mode = Literal["full_mesh", "partial_view"]

LOOPBACK = LinkModel(latency=(0.0002, 0.001), bandwidth=0.0)
"""One machine's loopback: what the real-process convergence benchmark ran on."""
WAN = LinkModel(latency=(0.005, 0.05), bandwidth=125e6)
"""Nodes spread over a continent: 5-50 ms one way, 1 Gbit/s out of each node."""


def registry_for(mode: Mode, base: RegistryConfig | None = None) -> RegistryConfig:
    """The registry settings of a mode: the partial view as configured, or today's full mesh (no active view,
    pushes to `fanout` = 4 random live peers, anti-entropy with a random live peer)."""
    base = base or RegistryConfig()
    if mode == "full_mesh":
        return dataclasses.replace(base, active_view=0, fanout=4, passive_anti_entropy=0.0)
    return base if base.active_view else dataclasses.replace(base, active_view=6, fanout=6)


@dataclass(frozen=True)
class SimConfig:
    """One simulated mesh."""

    nodes: int = field(metadata={"help": "Nodes at the warm start (bootstrap peers included)."})
    mode: Mode = field(default="partial_view", metadata={"help": "full_mesh (today) or partial_view."})
    seed: int = field(default=1, metadata={"help": "Seed of every random choice: a run is a function of it."})
    registry: RegistryConfig | None = field(
        default=None, metadata={"help": "Registry settings; None: `registry_for(mode)`."}
    )
    fabric: FabricConfig = field(default_factory=FabricConfig, metadata={"help": "Fabric settings."})
    link: LinkModel = field(default=WAN, metadata={"help": "Latency, bandwidth and processing cost."})
    bootstraps: int = field(default=3, metadata={"help": "Bootstrap peers (nodes 0..k-1) joiners dial."})
    lazy_push: bool = field(
        default=True,
        metadata={
            "help": "Partial views: records go along a tree of eager links and ids over the others "
            "(`registry/lazy_push.py`); False floods every record over every link, as before lazy push."
        },
    )
    serving: float = field(
        default=1.0,
        metadata={"help": "Share of warm-start nodes serving a model (SERVING); the rest are JOIN."},
    )

    def __post_init__(self) -> None:
        if self.nodes < 2 or not 1 <= self.bootstraps <= self.nodes or not 0.0 <= self.serving <= 1.0:
            raise ValueError("nodes >= 2, 1 <= bootstraps <= nodes and serving in [0, 1]")

    @property
    def registry_config(self) -> RegistryConfig:
        """The registry settings in effect."""
        return self.registry if self.registry is not None else registry_for(self.mode)
