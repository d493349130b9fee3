"""Errors of the user-facing service (each knows its status, OpenAI error type and code)."""

from __future__ import annotations

from opentela.errors import AuthenticationError, ClientError


class KeyRevokedError(AuthenticationError):
    """The API key was revoked."""

    code = "api_key_revoked"


class KeyExpiredError(AuthenticationError):
    """The API key has expired."""

    code = "api_key_expired"


class AdminRequiredError(AuthenticationError):
    """This endpoint needs the admin token."""

    code = "admin_token_required"


class ModelNotAllowedError(ClientError):
    """The key may not use this model."""

    status_code = 403
    error_type = "permission_error"
    code = "model_not_allowed"


class KeyNotFoundError(ClientError):
    """No API key with this id."""

    status_code = 404
    code = "key_not_found"


class RateLimitExceededError(ClientError):
    """A per-minute rate limit of the key was hit; retry after the window moves on."""

    status_code = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"


class BudgetExceededError(ClientError):
    """The key's budget for the current period is spent."""

    status_code = 402
    error_type = "insufficient_quota"
    code = "budget_exceeded"


class LoginRequiredError(AuthenticationError):
    """No valid login session: the dashboard sends the user to log in."""

    code = "login_required"


class KeyLimitReachedError(ClientError):
    """The user holds as many active keys as their group allows."""

    status_code = 403
    error_type = "permission_error"
    code = "key_limit_reached"


class CrossOriginError(ClientError):
    """A cookie-authenticated change that did not come from the dashboard's own page."""

    status_code = 403
    error_type = "permission_error"
    code = "cross_origin_request"


ACCEPTED_ENCODINGS = "gzip, deflate, identity"
"""The request content codings the frontend decodes (the Accept-Encoding of a 415)."""


class UnsupportedContentEncodingError(ClientError):
    """The request body is compressed with a coding the frontend cannot undo."""

    status_code = 415
    code = "unsupported_content_encoding"
