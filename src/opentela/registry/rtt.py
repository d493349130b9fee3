"""Round-trip times to peers, measured by the liveness probes this node sends anyway.

A probe is one request and one answer on a fabric stream, so its duration is the peer's round trip plus a small
fixed cost at both ends; the table keeps a moving average per peer and the smallest sample, which is the better
estimate of the path itself when the peer was busy. The split-model planner reads it (docs/pipeline.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from opentela._types import PeerId

_EWMA = 0.2


@dataclass
class _Sample:
    mean_s: float
    min_s: float
    count: int = 1


class RttTable:
    """Per-peer round-trip times in seconds, from answered probes."""

    def __init__(self) -> None:
        self._peers: dict[PeerId, _Sample] = {}

    def __repr__(self) -> str:
        return f"<RttTable peers={len(self._peers)}>"

    def observe(self, peer: PeerId, seconds: float) -> None:
        """Add one answered probe's duration."""
        if not seconds >= 0:
            return
        sample = self._peers.get(peer)
        if sample is None:
            self._peers[peer] = _Sample(seconds, seconds)
            return
        sample.mean_s += _EWMA * (seconds - sample.mean_s)
        sample.min_s = min(sample.min_s, seconds)
        sample.count += 1

    def forget(self, peer: PeerId) -> None:
        """Drop a peer that left."""
        self._peers.pop(peer, None)

    def get(self, peer: PeerId) -> float | None:
        """The moving average for `peer`, or None before its first answer."""
        sample = self._peers.get(peer)
        return sample.mean_s if sample is not None else None

    def snapshot(self) -> dict[PeerId, dict[str, float]]:
        """Every peer's mean and smallest round trip in milliseconds, and how many probes measured them."""
        return {
            peer: {"ms": round(s.mean_s * 1000, 3), "min_ms": round(s.min_s * 1000, 3), "probes": s.count}
            for peer, s in sorted(self._peers.items())
        }
