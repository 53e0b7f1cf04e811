"""Streamable-HTTP transport: for a server on another machine (e.g. a GPU box).

Safe by default: binds 127.0.0.1; keeps the SDK's DNS-rebinding protection on (Host/Origin
checked against an allow-list); refuses to bind a non-loopback address unless a bearer token
is set, and with a token every request without ``Authorization: Bearer <token>`` gets 401.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from mcp.server import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

from mcp_interp.errors import HttpConfigError

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]

TOKEN_ENV = "MCP_INTERP_AUTH_TOKEN"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def security_settings(host: str, port: int, extra_hosts: Sequence[str]) -> TransportSecuritySettings:
    """DNS-rebinding protection stays on; the allow-list covers loopback, the bound host, and extras."""
    hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*", f"{host}:*", *[h if ":" in h else f"{h}:*" for h in extra_hosts]]
    origins = [f"http://{h}" for h in hosts] + [f"https://{h}" for h in hosts]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins)


class BearerAuth:
    """ASGI middleware: HTTP requests need ``Authorization: Bearer <token>`` (constant-time check)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                body = json.dumps({"error": "unauthorized", "detail": "send Authorization: Bearer <token>"}).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def build_app(server: MCPServer[Any], host: str, port: int, token: str | None, allowed_hosts: Sequence[str]) -> Any:
    if not is_loopback(host) and not token:
        raise HttpConfigError(
            f"Refusing to serve on {host}, which is not a loopback address, without authentication: anyone who can "
            f"reach it could run the model. Set --auth-token (or {TOKEN_ENV}), or bind 127.0.0.1 and tunnel (ssh -L)."
        )
    if token is not None and len(token) < 16:
        raise HttpConfigError("--auth-token must be at least 16 characters (e.g. `openssl rand -hex 32`).")
    app = server.streamable_http_app(host=host, transport_security=security_settings(host, port, allowed_hosts))
    return BearerAuth(app, token) if token else app


def run_http(server: MCPServer[Any], host: str, port: int, token: str | None, allowed_hosts: Sequence[str]) -> None:
    import uvicorn

    app = build_app(server, host, port, token, allowed_hosts)
    log.info(
        "serving MCP over streamable HTTP at http://%s:%d/mcp (auth: %s)", host, port, "bearer" if token else "none"
    )
    uvicorn.run(app, host=host, port=port, log_level="info")
