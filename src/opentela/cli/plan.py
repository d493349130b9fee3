"""`otela plan`: place models on a cluster's idle devices (the scheduler's CP-SAT placement)."""

from __future__ import annotations

from opentela.scheduler.commands import add_plan_arguments as add_arguments
from opentela.scheduler.commands import run

__all__ = ["add_arguments", "run"]
