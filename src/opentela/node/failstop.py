"""Fail-stop: a node whose engine cannot serve any more says so and gets out of the way.

The first fatal condition wins: it writes DOWN (pushed to every peer), ships the tail of the engine's and the
node's logs to the sink, and asks the node to exit with that condition's code. Later conditions (the engine
dying of what its log already said) are ignored.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable

from opentela.errors import OpenTelaError
from opentela.node._config import NodeConfig
from opentela.node.engine_set import EngineSet
from opentela.node.logsink import FailStopReport, LogSink, RecentLogs

logger = logging.getLogger(__name__)

Identify = Callable[[], tuple[str, str, str]]
"""(peer id, session id, provider id) of the node now: the session changes when the node rejoins."""


class FailStop:
    """The node's exit on a fatal local condition; call it with the reason and the exit code."""

    def __init__(
        self,
        config: NodeConfig,
        engines: EngineSet,
        *,
        identify: Identify,
        go_down: Callable[[str], Awaitable[None]],
        request_stop: Callable[[int], None],
        stopping: Callable[[], bool],
        log_sink: LogSink | None = None,
        node_log: RecentLogs | None = None,
    ) -> None:
        self.config, self.engines = config, engines
        self._identify, self._go_down = identify, go_down
        self._request_stop, self._stopping = request_stop, stopping
        self.log_sink, self.node_log = log_sink, node_log
        self.failing = False

    def __repr__(self) -> str:
        return f"<FailStop failing={self.failing} sink={self.log_sink is not None}>"

    async def __call__(self, reason: str, code: int) -> None:
        """Write DOWN, ship the log tail to the sink, and ask the node to exit with `code` (once)."""
        if self.failing or self._stopping():
            return
        self.failing = True
        self.engines.retire()  # refuse new tunnelled requests at once
        try:
            await self._go_down(reason)
        except OpenTelaError as exc:
            logger.warning("could not announce DOWN: %s", exc)
        if self.log_sink is not None:
            await self.log_sink.ship(self.report(reason, code))
        self._request_stop(code)

    def report(self, reason: str, code: int) -> FailStopReport:
        """What this node says about itself when it fail-stops."""
        n = self.config.log_tail_lines
        runner = self.engines.first
        peer_id, session_id, provider_id = self._identify()
        return FailStopReport(
            peer_id=peer_id,
            session_id=session_id,
            provider_id=provider_id,
            hostname=socket.gethostname(),
            reason=reason,
            exit_code=code,
            engine=runner.spec.name if runner else "",
            engine_log_path=str(runner.log_path) if runner else "",
            engine_log=runner.log_tail(n) if runner else [],
            node_log=self.node_log.tail(n) if self.node_log is not None else [],
        )
