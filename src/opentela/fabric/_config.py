"""Settings of the fabric: connect and handshake timeouts, flow-control windows, stream limits, keepalive."""

from __future__ import annotations

from dataclasses import dataclass, field

from opentela.errors import ConfigError
from opentela.fabric._frames import INITIAL_WINDOW, MAX_FRAME_PAYLOAD, MAX_WINDOW


@dataclass(frozen=True)
class FabricConfig:
    """How this node's peer connections behave; peers may differ in every setting."""

    dial_timeout: float = field(
        default=5.0,
        metadata={
            "help": "Seconds to open a connection to a peer (TCP, TLS and identity handshake together)."
        },
    )
    handshake_timeout: float = field(
        default=5.0,
        metadata={"help": "Seconds an inbound connection may take to finish the TLS and identity handshake."},
    )
    stream_window: int = field(
        default=INITIAL_WINDOW,
        metadata={
            "help": "Bytes a peer may send on one stream before we read them (receive window, at least 262144)."
        },
    )
    max_frame_payload: int = field(
        default=64 * 1024,
        metadata={
            "help": "Largest DATA payload we send in one frame (at most 262144, what every peer accepts)."
        },
    )
    max_inbound_streams: int = field(
        default=1024,
        metadata={"help": "Streams a peer may have open towards us on one connection; more are refused."},
    )
    keepalive_interval: float = field(
        default=15.0, metadata={"help": "Seconds of silence on a connection before we ping the peer."}
    )
    keepalive_timeout: float = field(
        default=10.0,
        metadata={"help": "Seconds to wait for the ping answer before the connection is declared dead."},
    )
    relay_serve: bool = field(
        default=True,
        metadata={
            "help": "Relay circuits for peers that cannot accept connections (only when reachable ourselves)."
        },
    )
    relay_max_reservations: int = field(
        default=128, metadata={"help": "Private peers this node keeps relay slots for."}
    )
    relay_max_circuits: int = field(
        default=256, metadata={"help": "Relayed connections this node carries at once."}
    )
    dial_back_limit: int = field(
        default=4,
        metadata={
            "help": "Dial-back checks one peer may ask of this node per dial_back_window (only ever to the "
            "asker's own addresses); more are refused and counted."
        },
    )
    dial_back_window: float = field(
        default=60.0, metadata={"help": "Seconds over which dial_back_limit counts a peer's requests."}
    )
    conn_low_water: int = field(
        default=32,
        metadata={
            "help": "Open connections that trimming (see conn_high_water) closes down to, never below."
        },
    )
    conn_high_water: int = field(
        default=48,
        metadata={
            "help": "Open connections above which the longest idle ones are closed, down to conn_low_water "
            "(never one with open streams, younger than conn_grace, a bootstrap peer or a relay)."
        },
    )
    conn_grace: float = field(
        default=20.0,
        metadata={"help": "Seconds after a connection opens during which no limit or idleness closes it."},
    )
    conn_idle_timeout: float = field(
        default=120.0,
        metadata={
            "help": "Seconds an unprotected connection without open streams is kept before it is closed, "
            "whatever the count; 0 never closes a connection for being idle."
        },
    )

    join_token: str = field(
        default="",
        repr=False,  # a bearer secret: kept out of `otela config show` and logs
        metadata={
            "help": "Join token of a closed network (from `otela network issue`); empty: open network. "
            "Prefer join_token_file or the variable: flags show up in process lists."
        },
    )
    join_token_file: str = field(
        default="", metadata={"help": "File holding the join token (instead of join_token)."}
    )
    network_id: str = field(
        default="",
        metadata={
            "help": "Closed network this node must belong to (otn_...); the join token must be for it. "
            "Optional: the token names its network."
        },
    )
    revoked_tokens: tuple[str, ...] = field(
        default=(),
        metadata={"help": "Token ids (hex, see `otela network show-token`) whose holders are refused."},
    )

    def __post_init__(self) -> None:
        for name in (
            "dial_timeout",
            "handshake_timeout",
            "keepalive_interval",
            "keepalive_timeout",
            "dial_back_window",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(f"[fabric] {name} must be positive, got {getattr(self, name)!r}")
        if not INITIAL_WINDOW <= self.stream_window <= MAX_WINDOW:
            raise ConfigError(f"[fabric] stream_window must be {INITIAL_WINDOW}..{MAX_WINDOW} bytes")
        if not 1024 <= self.max_frame_payload <= MAX_FRAME_PAYLOAD:
            raise ConfigError(f"[fabric] max_frame_payload must be 1024..{MAX_FRAME_PAYLOAD} bytes")
        if self.dial_back_limit < 1:
            raise ConfigError("[fabric] dial_back_limit must be at least 1")
        if self.max_inbound_streams < 1:
            raise ConfigError("[fabric] max_inbound_streams must be at least 1")
        if not 1 <= self.conn_low_water <= self.conn_high_water:
            raise ConfigError(
                "[fabric] conn_low_water and conn_high_water must be at least 1, with conn_low_water <= "
                f"conn_high_water (got {self.conn_low_water} and {self.conn_high_water})"
            )
        for name in ("conn_grace", "conn_idle_timeout"):
            if getattr(self, name) < 0:
                raise ConfigError(f"[fabric] {name} cannot be negative, got {getattr(self, name)!r}")
