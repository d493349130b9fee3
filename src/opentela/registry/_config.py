"""Settings of the registry: partial views, replication fan-out and pace, SWIM failure detection, retention."""

from __future__ import annotations

from dataclasses import dataclass, field

from opentela.errors import ConfigError

DAY = 86400.0


@dataclass(frozen=True)
class RegistryConfig:
    """Which peers are a node's neighbours, how records replicate and peers are watched, how long dead records stay."""

    fanout: int = field(
        default=6,
        metadata={
            "help": "Peers a record new to this replica is pushed to at once: active-view peers other than the "
            "sender (all of them up to this many, so the default floods the active view), or random live peers "
            "when active_view is 0; 0 turns pushing off (anti-entropy alone repairs)."
        },
    )
    anti_entropy_interval: float = field(
        default=2.0,
        metadata={
            "help": "Seconds between digest exchanges with one peer (a neighbour, now and then a passive peer)."
        },
    )
    active_view: int = field(
        default=6,
        metadata={
            "help": "Peers in this node's active view (HyParView): the only ones it keeps connections to, probes "
            "with SWIM and floods changes to; about ln(N)/2 + 1 for N nodes (5.6 at 10,000), at least 2. 0 turns "
            "partial views off: every node probes and gossips with every live peer."
        },
    )
    passive_view: int = field(
        default=30,
        metadata={
            "help": "Peers kept as candidates to repair the active view from, refreshed by shuffles; no "
            "connection is kept to them."
        },
    )
    shuffle_interval: float = field(
        default=60.0,
        metadata={
            "help": "Seconds between shuffles (a three-hop random walk that swaps samples of the views) and "
            "top-ups of an active view that is not full; a failed neighbour is replaced at once regardless."
        },
    )
    active_walk: int = field(
        default=6,
        metadata={
            "help": "Length of the random walks that take a joining node into active views (FORWARD_JOIN)."
        },
    )
    passive_walk: int = field(
        default=3,
        metadata={"help": "Hops left on a join walk at which the node there keeps the joiner as passive."},
    )
    passive_anti_entropy: float = field(
        default=0.05,
        metadata={
            "help": "Share of anti-entropy rounds run with a passive-view peer instead of an active one (over a "
            "short-lived connection): repairs replicas even if the active views ever split the mesh in two."
        },
    )
    join_sync_shards: int = field(
        default=6,
        metadata={
            "help": "A joining node pulls the registry in this many parts (by key hash), one from each of its "
            "first neighbours, so that no peer (least of all the bootstrap peer it joined through) serves every "
            "joiner the whole registry; 1 pulls it whole from the first neighbour."
        },
    )
    join_sync_wait: float = field(
        default=1.0,
        metadata={
            "help": "Seconds a joining node waits for neighbours other than its bootstrap contact before it "
            "asks the neighbours it has (the contact last) for the parts still missing."
        },
    )
    probe_interval: float = field(
        default=1.0,
        metadata={"help": "Seconds between SWIM probes of the next peer (randomized round robin)."},
    )
    probe_timeout: float = field(
        default=0.5,
        metadata={"help": "Seconds a direct probe waits for its answer before other peers are asked to try."},
    )
    indirect_probes: int = field(
        default=3, metadata={"help": "Peers asked to probe a silent peer on our behalf (SWIM ping-req)."}
    )
    indirect_timeout: float = field(
        default=1.0, metadata={"help": "Seconds the indirect probes of a silent peer may take."}
    )
    suspicion_timeout: float = field(
        default=10.0,
        metadata={
            "help": "Seconds a suspected peer has to refute before it is evicted (LEFT); it is out of routing "
            "from the moment it is suspected."
        },
    )
    local_health_limit: int = field(
        default=8,
        metadata={
            "help": "Highest local health score: a node that finds itself slow (its event loop stalled during a "
            "probe, or it had to refute a suspicion of itself) multiplies its probe and suspicion timeouts by up "
            "to 1 + this; 0 turns the mechanism off."
        },
    )
    retransmit_mult: int = field(
        default=3,
        metadata={
            "help": "Each membership update rides on mult x log2(N+1) probe messages before it is dropped."
        },
    )
    max_piggyback: int = field(
        default=6, metadata={"help": "Membership updates carried by one probe message."}
    )
    eviction_quorum: int = field(
        default=3,
        metadata={
            "help": "Distinct members whose evictions of a session make this node merge them even though its "
            "own probes still reach that session; below that, an eviction waits for this node's own evidence "
            "(1: any member's eviction merges at once, the behaviour before evidence was required)."
        },
    )
    eviction_hold: float = field(
        default=30.0,
        metadata={
            "help": "Seconds an eviction without evidence is held and re-checked (a failed probe of ours or a "
            "quorum merges it) before it is refused."
        },
    )
    eviction_signer_limit: int = field(
        default=6,
        metadata={
            "help": "Evictions without evidence one member may have this node hold per eviction_signer_window; "
            "more are dropped unexamined and counted."
        },
    )
    eviction_signer_window: float = field(
        default=60.0,
        metadata={"help": "Seconds over which eviction_signer_limit counts a signer's evictions."},
    )
    left_retention: float = field(
        default=DAY,
        metadata={
            "help": "Seconds a DOWN or LEFT record stays visible in the node table before it is hidden."
        },
    )
    tombstone_retention: float = field(
        default=7 * DAY,
        metadata={
            "help": "Seconds after its last write when a record is compacted away, and after which a replica "
            "refuses it (so an old replica cannot bring it back)."
        },
    )
    refresh_interval: float = field(
        default=3600.0,
        metadata={"help": "Seconds between re-signings of a node's own unchanged record, keeping it fresh."},
    )
    gc_interval: float = field(
        default=60.0, metadata={"help": "Seconds between garbage collection passes over the registry."}
    )
    gossip_timeout: float = field(default=5.0, metadata={"help": "Seconds one gossip exchange may take."})
    max_message_bytes: int = field(
        default=4 * 1024 * 1024,
        metadata={"help": "Largest gossip message; bigger deltas are sent in chunks."},
    )
    max_clock_skew: float = field(
        default=300.0,
        metadata={
            "help": "Seconds a record's timestamps may be ahead of this node's clock; later ones are refused "
            "(they would never age out)."
        },
    )
    max_sessions_per_peer: int = field(
        default=8,
        metadata={
            "help": "Live (not LEFT) sessions one peer id may have in the registry; more new sessions are "
            "refused until old ones leave (a restarted node has two for a while)."
        },
    )
    max_tombstones_per_signer: int = field(
        default=1024,
        metadata={
            "help": "LEFT records signed by one member kept until compaction; past it, the end of a session this "
            "node never saw is refused when that member signed it (the end of a session it holds always merges)."
        },
    )
    write_rate: float = field(
        default=0.5,
        metadata={
            "help": "Sustained record writes per second accepted from one owner (token bucket); an honest node "
            "writes a few per state change and one an hour when idle."
        },
    )
    write_burst: int = field(
        default=30, metadata={"help": "Record writes one owner may make at once before write_rate applies."}
    )
    max_record_bytes: int = field(
        default=64 * 1024,
        metadata={
            "help": "Largest record (msgpack) taken from a peer; larger ones are refused as malformed. An "
            "honest record is 1-3 KB; every node of a mesh should use the same value."
        },
    )
    max_records_per_message: int = field(
        default=256, metadata={"help": "Records per gossip message when sending a delta."}
    )

    def __post_init__(self) -> None:
        positive = (
            "anti_entropy_interval",
            "probe_interval",
            "probe_timeout",
            "indirect_timeout",
            "suspicion_timeout",
            "left_retention",
            "tombstone_retention",
            "refresh_interval",
            "gc_interval",
            "gossip_timeout",
            "shuffle_interval",
            "eviction_hold",
            "eviction_signer_window",
            "join_sync_wait",
            "max_clock_skew",
            "write_rate",
        )
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(f"[registry] {name} must be positive, got {getattr(self, name)!r}")
        if self.local_health_limit < 0:
            raise ConfigError("[registry] local_health_limit must be >= 0")
        if self.indirect_probes < 0 or self.retransmit_mult < 1 or self.max_piggyback < 1:
            raise ConfigError("[registry] indirect_probes >= 0, retransmit_mult >= 1 and max_piggyback >= 1")
        if self.max_record_bytes < 4096:
            raise ConfigError(
                "[registry] max_record_bytes must be at least 4096 (an honest record is 1-3 KB)"
            )
        if self.max_sessions_per_peer < 1 or self.write_burst < 1 or self.max_tombstones_per_signer < 1:
            raise ConfigError(
                "[registry] max_sessions_per_peer, max_tombstones_per_signer and write_burst must be at least 1"
            )
        if self.active_view == 1 or self.active_view < 0 or self.passive_view < 0:
            raise ConfigError("[registry] active_view must be 0 (off) or at least 2, passive_view >= 0")
        if not 0 <= self.passive_walk <= self.active_walk:
            raise ConfigError("[registry] passive_walk must be between 0 and active_walk")
        if not 0.0 <= self.passive_anti_entropy <= 1.0 or self.fanout < 0:
            raise ConfigError("[registry] passive_anti_entropy must be in [0, 1] and fanout >= 0")
        if self.join_sync_shards < 1:
            raise ConfigError("[registry] join_sync_shards must be at least 1")
        if self.eviction_quorum < 1 or self.eviction_signer_limit < 1:
            raise ConfigError("[registry] eviction_quorum and eviction_signer_limit must be at least 1")
        if self.tombstone_retention <= self.left_retention:
            raise ConfigError("[registry] tombstone_retention must be longer than left_retention")
        if self.refresh_interval * 2 > self.tombstone_retention:
            raise ConfigError("[registry] refresh_interval must be at most half of tombstone_retention")
