"""Settings of the registry: replication fan-out and pace, liveness probing."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RegistryConfig:
    """How records replicate and how peers are watched."""

    fanout: int = field(default=3, metadata={"help": "Peers a changed record is pushed to at once."})
    anti_entropy_interval: float = field(
        default=2.0, metadata={"help": "Seconds between digest exchanges with one random peer."}
    )
    probe_interval: float = field(
        default=1.0, metadata={"help": "Seconds between liveness probes of a random peer."}
    )
    probe_timeout: float = field(default=1.0, metadata={"help": "Seconds a probe waits for its answer."})
    gossip_timeout: float = field(default=5.0, metadata={"help": "Seconds one gossip exchange may take."})
    max_message_bytes: int = field(
        default=4 * 1024 * 1024,
        metadata={"help": "Largest gossip message; bigger deltas are sent in chunks."},
    )
    max_records_per_message: int = field(
        default=256, metadata={"help": "Records per gossip message when sending a delta."}
    )
