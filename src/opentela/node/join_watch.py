"""Watching a node join the mesh: the notices for a bootstrap to itself or to nobody, and for a node alone.

Pure: the agent reports each bootstrap dial's outcome and, now and then, how many peers it sees; times are
monotonic seconds passed in, so tests drive it with a fake clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opentela.errors import HandshakeError
from opentela.node.notices import BOOTSTRAP_SELF, BOOTSTRAP_UNANSWERED, JOINED_NOBODY, NO_PEERS, Notices


@dataclass
class _Dial:
    """What one bootstrap address did so far."""

    failing_since: float | None = None
    last_error: str = ""
    itself: bool = False


def is_self_dial(outcome: object) -> bool:
    """Whether a dial's outcome says the address is this very node."""
    return isinstance(outcome, HandshakeError) and bool(outcome.details.get("self_dial"))


class JoinWatch:
    """Posts and resolves the joining notices of one node.

    `warn_after` bounds how long a bootstrap address may go unanswered, and a worker stay without peers, before
    a notice goes up; `alone_after` does the same for an ingress without peers. 0 turns a check off.
    """

    def __init__(
        self,
        notices: Notices,
        *,
        ingress: bool,
        bootstrap: Sequence[str],
        own_addr: Callable[[], str],
        warn_after: float,
        alone_after: float,
        now: float,
    ) -> None:
        self.notices = notices
        self.ingress = ingress
        self.bootstrap = tuple(dict.fromkeys(bootstrap))
        self._own_addr = own_addr
        self.warn_after, self.alone_after = warn_after, alone_after
        self._dials = {addr: _Dial() for addr in self.bootstrap}
        self._bootstrapping = bool(self.bootstrap)
        self._alone_since: float | None = now

    def __repr__(self) -> str:
        state = "bootstrapping" if self._bootstrapping else "joined" if self._alone_since is None else "alone"
        return f"<JoinWatch {state} {self.notices!r}>"

    @property
    def check_interval(self) -> float:
        """How often `observe` should run for the notices to go up close to their thresholds."""
        limits = [t for t in (self.warn_after, self.alone_after) if t > 0]
        return max(0.05, min([1.0, *(t / 4 for t in limits)]))

    def dialed(self, addr: str, outcome: object, now: float) -> None:
        """A bootstrap dial of `addr` ended: a peer id, or the exception it raised."""
        dial = self._dials.setdefault(addr, _Dial())
        if is_self_dial(outcome):
            dial.itself = True
            if len(self.bootstrap) > 1:
                # A seed list shared by every node names each node too: harmless while the others answer,
                # and if none does the joined_nobody notice says this address was ourselves.
                return
            self.notices.post(
                BOOTSTRAP_SELF,
                f"bootstrap address {addr} is this very node (it answers with this node's own identity key), "
                "so this node joined nobody through it: point --bootstrap at another node's address, or, "
                "when two nodes run on one machine, give each its own key with --key-file",
                subject=addr,
            )
        elif isinstance(outcome, BaseException):
            if dial.failing_since is None:
                dial.failing_since = now
            dial.last_error = str(outcome) or type(outcome).__name__
            self._check_unanswered(now)
        else:
            dial.failing_since, dial.last_error = None, ""
            self.notices.resolve(BOOTSTRAP_UNANSWERED, addr, "it answered")

    def bootstrap_done(self) -> None:
        """Bootstrapping stopped (a peer answered, or every address was this node): no address is retried."""
        self._bootstrapping = False
        self.notices.resolve_code(BOOTSTRAP_UNANSWERED, "bootstrapping is over")

    def observe(self, peers: int, now: float, *, has_engine: bool = False) -> None:
        """The node sees `peers` other live nodes at `now`: put up or take down the notices that depend on it.

        An ingress that runs an engine itself has something to serve alone, so it is never short of peers.
        """
        if self._bootstrapping:
            self._check_unanswered(now)
        if peers > 0 or (self.ingress and has_engine):
            self._alone_since = None
            why = f"{peers} peer(s) now" if peers else "this ingress runs an engine itself"
            self.notices.resolve(JOINED_NOBODY, why=why)
            self.notices.resolve(NO_PEERS, why=why)
            return
        if self._alone_since is None:
            self._alone_since = now
        alone = now - self._alone_since
        if self.ingress:
            if self.alone_after > 0 and alone >= self.alone_after:
                self.notices.post(NO_PEERS, self._no_peers_message(alone))
        elif self.warn_after > 0 and (not self.bootstrap or alone >= self.warn_after):
            self.notices.post(JOINED_NOBODY, self._joined_nobody_message())

    def _check_unanswered(self, now: float) -> None:
        if self.warn_after <= 0:
            return
        for addr, dial in self._dials.items():
            if dial.failing_since is not None and now - dial.failing_since >= self.warn_after:
                self.notices.post(
                    BOOTSTRAP_UNANSWERED,
                    f"bootstrap address {addr} has not answered for {now - dial.failing_since:.0f} s "
                    f"(last error: {dial.last_error}); still retrying. Is the node there running, is the "
                    "port its fabric --listen port (not its --http port), and does no firewall block it?",
                    subject=addr,
                )

    def _joined_nobody_message(self) -> str:
        own = self._own_addr()
        if not self.bootstrap:
            return (
                "this node was started without --bootstrap and no peer has joined it, so no request can "
                f"reach it: restart it with --bootstrap ADDRESS of the ingress, or start others with "
                f"--bootstrap {own}"
            )
        tried = ", ".join(
            f"{addr} (this node itself)" if d.itself else f"{addr} ({d.last_error or 'no answer yet'})"
            for addr, d in self._dials.items()
            if addr in self.bootstrap
        )
        return (
            f"joined no peer; requests cannot reach this node and it serves nobody. Bootstrap addresses "
            f"tried: {tried}. Point --bootstrap at the ingress's fabric address (the `bootstrap` line "
            "`otela start --ingress` prints)"
        )

    def _no_peers_message(self, alone: float) -> str:
        return (
            f"no peer has joined this ingress for {alone:.0f} s, so it has no model to serve "
            f"(/v1/models is empty): start providers with `otela start --bootstrap {self._own_addr()} ...`"
        )
