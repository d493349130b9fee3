"""The fabric: identities, mutually authenticated TLS connections and the stream multiplexer between peers."""

from opentela.fabric._config import FabricConfig
from opentela.fabric.addresses import format_addr, parse_addr
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity, peer_id_from_public_key, verify_signature
from opentela.fabric.messages import read_msg, write_msg

__all__ = [
    "FabricConfig",
    "Host",
    "Identity",
    "format_addr",
    "parse_addr",
    "peer_id_from_public_key",
    "read_msg",
    "verify_signature",
    "write_msg",
]
