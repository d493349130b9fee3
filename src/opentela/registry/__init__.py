"""The registry: signed node records in a G-Map CRDT, its views, gossip replication and local liveness."""

from opentela.registry._config import RegistryConfig
from opentela.registry.crdt import GMap, merge
from opentela.registry.record import ModelEntry, NodeRecord
from opentela.registry.registry import Registry

__all__ = ["GMap", "ModelEntry", "NodeRecord", "Registry", "RegistryConfig", "merge"]
