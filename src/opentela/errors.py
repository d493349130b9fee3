"""The exception tree: every failure knows its HTTP status, OpenAI error type, code and whether to retry."""

from __future__ import annotations

from typing import Any


class OpenTelaError(Exception):
    """Root of all OpenTela errors."""

    status_code: int = 500
    error_type: str = "server_error"
    code: str = "internal_error"
    retryable: bool = False

    def __init__(self, message: str = "", *, param: str | None = None, **details: Any) -> None:
        super().__init__(message or self.__class__.__doc__ or self.code)
        self.message = message or (self.__class__.__doc__ or self.code).strip()
        self.param = param
        self.details = details

    def to_openai(self) -> dict[str, Any]:
        """Render in the OpenAI error shape."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


# --- fabric: the mesh itself -------------------------------------------------------------------------------
class FabricError(OpenTelaError):
    """A peer-to-peer transport failure."""

    status_code = 502
    error_type = "upstream_error"
    code = "fabric_error"
    retryable = True


class PeerUnreachableError(FabricError):
    """No connection to the peer could be opened."""

    code = "peer_unreachable"


class HandshakeError(FabricError):
    """The peer failed the identity handshake (wrong key, bad proof, or protocol mismatch)."""

    code = "handshake_failed"


class AdmissionError(HandshakeError):
    """The peer is not a member of this closed network (no, foreign, expired or revoked join token)."""

    status_code = 403
    error_type = "permission_error"
    code = "not_admitted"
    retryable = False


class ProtocolError(FabricError):
    """The peer sent bytes that break the wire format."""

    code = "protocol_error"


class StreamResetError(FabricError):
    """The stream was aborted by either side."""

    code = "stream_reset"

    def __init__(self, message: str = "", *, reset_code: int = 0, **kw: Any) -> None:
        super().__init__(message or "stream reset", **kw)
        self.reset_code = reset_code


class ConnectionClosedError(FabricError):
    """The connection carrying the stream went away."""

    code = "connection_closed"


# --- timeouts -----------------------------------------------------------------------------------------------
class OpenTelaTimeout(OpenTelaError):
    """An operation ran past its deadline."""

    status_code = 504
    error_type = "timeout_error"
    code = "timeout"
    retryable = True


class DialTimeout(OpenTelaTimeout):
    """Opening a connection to a peer timed out."""

    code = "dial_timeout"


class UpstreamTimeout(OpenTelaTimeout):
    """The serving node or its engine did not answer in time."""

    code = "upstream_timeout"


# --- capacity ---------------------------------------------------------------------------------------------
class CapacityError(OpenTelaError):
    """No capacity to serve the request right now."""

    status_code = 503
    error_type = "service_unavailable"
    code = "no_capacity"
    retryable = True


class NoHealthyReplicaError(CapacityError):
    """The model is known but no healthy replica serves it."""

    code = "no_healthy_replica"


class ColdStartError(CapacityError):
    """A serverless model could not be started in time (or at all) for a held request."""

    code = "cold_start_failed"


class NoTrustedProviderError(CapacityError):
    """Replicas of the model exist, but none belongs to a provider the request trusts."""

    code = "no_trusted_provider"
    retryable = False


class UnmetConstraintError(CapacityError):
    """No replica of the model has the node properties the request requires."""

    code = "unmet_constraint"
    retryable = False


# --- engine -----------------------------------------------------------------------------------------------
class EngineError(OpenTelaError):
    """The serving engine failed."""

    status_code = 502
    error_type = "upstream_error"
    code = "engine_error"
    retryable = True


class EngineCrashedError(EngineError):
    """The engine process exited or dropped the connection."""

    code = "engine_crashed"


class EngineUnavailableError(EngineError):
    """The engine is not ready or not running on this node."""

    status_code = 503
    error_type = "service_unavailable"
    code = "engine_unavailable"


# --- client -----------------------------------------------------------------------------------------------
class ClientError(OpenTelaError):
    """The request itself is wrong; retrying it elsewhere will not help."""

    status_code = 400
    error_type = "invalid_request_error"
    code = "invalid_request"
    retryable = False


class InvalidRequestError(ClientError):
    """The request body is not valid."""


class RequestTooLargeError(ClientError):
    """The request body is over the configured limit."""

    status_code = 413
    code = "request_too_large"


class ModelNotFoundError(ClientError):
    """No node in the mesh serves or has served this model."""

    status_code = 404
    code = "model_not_found"


class AuthenticationError(ClientError):
    """Missing or invalid credentials."""

    status_code = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class NotFoundError(ClientError):
    """No such route."""

    status_code = 404
    code = "not_found"


class MethodNotAllowedError(ClientError):
    """The route exists but not for this method."""

    status_code = 405
    code = "method_not_allowed"


class OriginNotAllowedError(ClientError):
    """A cross-origin request from a page whose origin the `cors_origins` setting does not allow."""

    status_code = 403
    error_type = "permission_error"
    code = "origin_not_allowed"


class ConfigError(OpenTelaError):
    """The configuration is invalid."""

    code = "config_error"


class PluginError(ConfigError):
    """A plugin name is unknown or taken twice, or its import path does not load."""

    code = "plugin_error"


ERROR_CODES: dict[str, type[OpenTelaError]] = {}


def _index(cls: type[OpenTelaError]) -> None:
    ERROR_CODES.setdefault(cls.code, cls)
    for sub in cls.__subclasses__():
        _index(sub)


_index(OpenTelaError)


def error_from_code(code: str, message: str) -> OpenTelaError:
    """Rebuild an error received over the fabric as the same class the remote side raised."""
    return ERROR_CODES.get(code, OpenTelaError)(message)
