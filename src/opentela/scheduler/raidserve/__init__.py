"""RaidServe (`papers/raidserve.txt`): tensor-parallel replicas that keep serving on the devices a failure leaves.

`layout` places attention heads, KV cache and FFN shards for Standard TP, Non-uniform TP and RaidServe (hybrid
attention with cyclic KV placement); `recovery` plans what moves after a device is lost and how long it takes.
"""

from opentela.scheduler.raidserve.layout import (
    MODES,
    Layout,
    Mode,
    minimum_devices,
    plan_layout,
    standard_degree,
)
from opentela.scheduler.raidserve.recovery import RecoveryPlan, Transfer, plan_recovery

__all__ = [
    "MODES",
    "Layout",
    "Mode",
    "RecoveryPlan",
    "Transfer",
    "minimum_devices",
    "plan_layout",
    "plan_recovery",
    "standard_degree",
]
