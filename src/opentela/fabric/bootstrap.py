"""Joining the mesh: dial every bootstrap address, retrying with exponential backoff and full jitter."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence

from opentela._types import PeerId
from opentela.errors import HandshakeError, PeerUnreachableError
from opentela.fabric.addresses import parse_addr

logger = logging.getLogger(__name__)


def backoff_delay(
    round_no: int, initial_delay: float, max_delay: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait after failed round `round_no` (1-based): uniform in [0, min(max, initial * 2^(n-1))].

    Full jitter spreads a crowd of nodes restarting together over the whole interval instead of having them
    knock in lockstep.
    """
    cap = min(max_delay, initial_delay * 2 ** (round_no - 1))
    return (rng or random).uniform(0, cap)


async def bootstrap(
    connect: Callable[[str], Awaitable[PeerId]],
    addrs: Sequence[str],
    *,
    initial_delay: float = 0.5,
    max_delay: float = 30.0,
    attempts: int | None = None,
    rng: random.Random | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> list[PeerId]:
    """Call `connect` on every address each round until at least one answers; the peers reached.

    Retries forever when `attempts` is None; otherwise raises PeerUnreachableError after that many rounds.
    Addresses that turn out to be this node are dropped; if none is left, returns []. A malformed address
    raises ValueError at once rather than being retried forever.
    """
    pending = list(dict.fromkeys(addrs))
    for addr in pending:
        parse_addr(addr)
    round_no = 0
    while pending:
        results = await asyncio.gather(*(connect(a) for a in pending), return_exceptions=True)
        reached: list[PeerId] = []
        still: list[str] = []
        for addr, result in zip(pending, results, strict=True):
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result
            if isinstance(result, HandshakeError) and result.details.get("self_dial"):
                logger.info("bootstrap address %s is this node; skipping it", addr)
                continue
            still.append(addr)
            if isinstance(result, Exception):
                logger.info("bootstrap peer %s failed: %s", addr, result)
            elif result not in reached:
                reached.append(result)
        pending = still
        if reached:
            logger.info("bootstrapped", extra={"peers": ",".join(reached), "round": round_no + 1})
            return reached
        round_no += 1
        if not pending:
            break
        if attempts is not None and round_no >= attempts:
            raise PeerUnreachableError(
                f"no bootstrap peer answered after {round_no} rounds: {', '.join(pending)}"
            )
        delay = backoff_delay(round_no, initial_delay, max_delay, rng)
        # INFO, not WARNING: every round says it again; the node raises one notice after a while instead.
        logger.info(
            "no bootstrap peer reachable (round %d); retrying in %.2fs",
            round_no,
            delay,
            extra={"addrs": pending},
        )
        await sleep(delay)
    return []
