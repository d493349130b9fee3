"""`otela simulate`: simulate serving one model on one device type (the scheduler's discrete-event simulator)."""

from __future__ import annotations

from opentela.scheduler.commands import add_simulate_arguments as add_arguments
from opentela.scheduler.commands import run

__all__ = ["add_arguments", "run"]
