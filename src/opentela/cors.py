"""Cross-origin access to the OpenAI API (CORS, as the Fetch standard defines it), shared by the gateway and the
frontend: which origins a `cors_origins` setting allows, and the headers of a preflight and of an answer. Plain
functions, no web framework.

Only the OpenAI API paths (`/v1/...`) take part, and only requests carrying an `Origin` the setting allows get
CORS headers. `Access-Control-Allow-Credentials` is never sent: the API authenticates with the Authorization
header, which a page sets itself, never with cookies the browser would add.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from opentela.errors import ConfigError

API_PREFIX = "/v1/"
"""Paths under this prefix answer cross-origin requests; no other path does."""

ALLOW_ORIGIN = "Access-Control-Allow-Origin"
REQUEST_METHOD = "Access-Control-Request-Method"
REQUEST_HEADERS = "Access-Control-Request-Headers"

ALLOW_METHODS = "GET, POST, OPTIONS"
MAX_AGE = "600"
"""Seconds a browser may reuse a preflight's answer."""

DEFAULT_ALLOW_HEADERS = ", ".join(
    (
        "Authorization",
        "Content-Type",
        "X-Request-Id",
        "OpenAI-Organization",
        "OpenAI-Project",
        "OpenAI-Beta",
        "X-Stainless-Lang",
        "X-Stainless-Package-Version",
        "X-Stainless-OS",
        "X-Stainless-Arch",
        "X-Stainless-Runtime",
        "X-Stainless-Runtime-Version",
        "X-Stainless-Retry-Count",
        "X-Stainless-Timeout",
        "X-Stainless-Async",
    )
)
"""Allowed request headers when a preflight names none that can be echoed: what the openai SDKs send."""

EXPOSE_HEADERS = ", ".join(
    (
        "X-Request-Id",
        "X-Otela-Request-Id",
        "X-Otela-Model",
        "X-Otela-Node",
        "Retry-After",
        "X-Otela-Limit-Resets-At",
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
    )
)
"""Answer headers a page's script may read besides the CORS-safelisted ones."""

_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://(\[[0-9a-f:.]+\]|[a-z0-9._~%-]+)(:[0-9]{1,5})?")
# A header list as a preflight names it: field names (RFC 9110 tokens) separated by commas.
_FIELD_NAMES = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+(\s*,\s*[!#$%&'*+.^_`|~0-9A-Za-z-]+)*")
_MAX_REQUESTED = 2048


def parse_origins(entries: Iterable[str], setting: str) -> tuple[str, ...]:
    """The entries of `setting`, each `*` or an origin such as `https://app.example.org` (scheme, host, optional
    port; no path, no trailing slash), lower-cased as browsers send them; a ConfigError names the malformed ones."""
    origins = tuple(e.strip() for e in entries)
    bad = [e for e in origins if e != "*" and not _ORIGIN.fullmatch(e.lower())]
    if bad:
        raise ConfigError(
            f"{setting} entries are `*` or origins such as https://app.example.org (no path), "
            f"not {', '.join(repr(e) for e in bad)}"
        )
    return tuple(e.lower() for e in origins)


class CorsPolicy:
    """The origins one `cors_origins` setting allows, with the headers answered to each prepared once, so that
    answering a request costs one lookup of its `Origin`."""

    __slots__ = ("_answers", "_lines", "any_origin")

    def __init__(self, origins: tuple[str, ...]) -> None:
        self.any_origin = "*" in origins
        keys = ("*",) if self.any_origin else origins
        self._answers: dict[str, Mapping[str, str]] = {origin: _answer_headers(origin) for origin in keys}
        self._lines = {
            origin: "\r\n".join(f"{k}: {v}" for k, v in headers.items())
            for origin, headers in self._answers.items()
        }

    @classmethod
    def from_setting(cls, entries: Iterable[str], setting: str) -> CorsPolicy | None:
        """The policy of a setting's entries; None when it is empty (CORS off)."""
        origins = parse_origins(entries, setting)
        return cls(origins) if origins else None

    def allows(self, origin: str | None) -> bool:
        """Whether a page of `origin` may call the API."""
        return origin is not None and (self.any_origin or origin in self._answers)

    def answer_headers(self, origin: str | None) -> Mapping[str, str] | None:
        """The CORS headers of an answer to a request from `origin` (not to be changed); None if it gets none."""
        if origin is None:
            return None
        return self._answers["*"] if self.any_origin else self._answers.get(origin)

    def answer_lines(self, origin: str | None) -> str | None:
        """`answer_headers` as HTTP/1.1 header lines joined by CRLF, for writing a response head as text."""
        if origin is None:
            return None
        return self._lines["*"] if self.any_origin else self._lines.get(origin)

    def preflight_headers(self, origin: str, requested_headers: str | None) -> dict[str, str] | None:
        """The headers of the 204 answering a preflight from `origin`; None if the origin is not allowed."""
        if not self.allows(origin):
            return None
        requested = (requested_headers or "").strip()
        fits = len(requested) <= _MAX_REQUESTED and _FIELD_NAMES.fullmatch(requested) is not None
        headers = {
            ALLOW_ORIGIN: "*" if self.any_origin else origin,
            "Access-Control-Allow-Methods": ALLOW_METHODS,
            "Access-Control-Allow-Headers": requested if fits else DEFAULT_ALLOW_HEADERS,
            "Access-Control-Max-Age": MAX_AGE,
        }
        if not self.any_origin:
            headers["Vary"] = "Origin"
        return headers


def is_preflight(method: str, origin: str | None, requested_method: str | None) -> bool:
    """Whether a request is a CORS preflight: OPTIONS with an Origin and an Access-Control-Request-Method."""
    return method == "OPTIONS" and origin is not None and requested_method is not None


def refusal_message(origin: str) -> str:
    """What a preflight from an origin that is not allowed is told (with a 403)."""
    return f"cross-origin requests from {origin} are not allowed here (the cors_origins setting)"


def _answer_headers(origin: str) -> Mapping[str, str]:
    if origin == "*":
        return {ALLOW_ORIGIN: "*", "Access-Control-Expose-Headers": EXPOSE_HEADERS}
    return {ALLOW_ORIGIN: origin, "Vary": "Origin", "Access-Control-Expose-Headers": EXPOSE_HEADERS}
