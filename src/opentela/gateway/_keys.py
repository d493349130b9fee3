"""Typed keys under which routes find their gateway and a request its id, as aiohttp asks."""

from __future__ import annotations

from typing import Any

from aiohttp import web

GATEWAY_KEY: web.AppKey[Any] = web.AppKey("otela_gateway")

# aiohttp 3.13 added typed request storage keys and warns about plain strings; older versions take strings.
REQUEST_ID_KEY: Any = web.RequestKey("request_id", str) if hasattr(web, "RequestKey") else "request_id"
ROUTE_KEY: Any = web.RequestKey("otela_route", dict) if hasattr(web, "RequestKey") else "otela_route"
"""What routing did for a request (model, attempts, policy), for the access log."""
