"""A discrete-event simulator of the mesh's control plane, running the real registry algorithms at scale.

The pure state machines run unchanged: SWIM (`swim.SwimState`), the partial view (`partial_view.PartialView`),
the connection limits (`fabric.connection_manager.ConnectionLedger`), local health, and the CRDT's merge rule on
record ranks. What the asyncio drivers do around them (`membership.py`, `gossip.py`, `overlay.py`, the Host) is
re-expressed as events on a simulated clock, and every message weighs what the real encoders make of it
(`wire.py`). Layout:

  events.py        the clock: a heap of (time, sequence, callback)
  wire.py          message, frame, TLS and handshake sizes, measured from the real code
  network.py       latency, bandwidth, processing, connections, keepalive, byte accounting
  replica.py       every node's replica as ranks over a shared base
  members.py       SWIM member tables sharing one roster (full mesh at 10,000 nodes)
  probes.py        the SWIM driver         replication.py   push and anti-entropy
  overlays.py      today's full mesh       view_overlay.py  partial views and connection limits
  node.py          one node                mesh.py          all of them, and what is true
  harness.py       scenarios: warm start, idle, join, announce, churn
  metrics.py       percentiles and growth-law fits

`benchmarks/scale.py` runs it from 128 to 10,000 nodes; docs/benchmarks/scale.md has the results.
"""

from opentela.registry.sim.config import LOOPBACK, WAN, SimConfig, registry_for
from opentela.registry.sim.harness import announce, build, churn, detection_bound, idle, join
from opentela.registry.sim.mesh import Mesh
from opentela.registry.sim.network import LinkModel
from opentela.registry.sim.wire import WireSizes

__all__ = [
    "LOOPBACK",
    "WAN",
    "LinkModel",
    "Mesh",
    "SimConfig",
    "WireSizes",
    "announce",
    "build",
    "churn",
    "detection_bound",
    "idle",
    "join",
    "registry_for",
]
