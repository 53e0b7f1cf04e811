"""Streamable-HTTP transport: for a server on another machine (e.g. a GPU box), shared by a team.

Safe by default: binds 127.0.0.1; keeps the SDK's DNS-rebinding protection on (Host/Origin
checked against an allow-list); refuses to bind a non-loopback address unless bearer tokens
are set, and with tokens every request without ``Authorization: Bearer <token>`` (the scheme in any
case, RFC 7235) gets 401. Each token names a principal (``app.tokens``); the request carries it to the
tools in its ASGI scope (``PRINCIPAL_SCOPE``), where ``mcp.workspace`` turns it into that principal's
ledger, store and jobs. The SDK also sees the principal (``scope["user"]``), so an MCP session opened
with one token cannot be used with another.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from mcp.server import MCPServer
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.transport_security import TransportSecuritySettings

from mcp_interp.app.tokens import TOKEN_ENV, Principals
from mcp_interp.errors import HttpConfigError
from mcp_interp.mcp.workspace import PRINCIPAL_SCOPE

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


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


def bearer_token(value: bytes) -> bytes | None:
    """The token of an ``Authorization`` value ``Bearer <token>``: the scheme is case-insensitive (RFC 7235) and
    followed by one or more spaces; None for any other scheme or no token."""
    scheme, _, rest = value.partition(b" ")
    token = rest.lstrip(b" ")
    return token if scheme.lower() == b"bearer" and token else None


class BearerAuth:
    """ASGI middleware: HTTP requests need ``Authorization: Bearer <token>`` for one of the principals' tokens
    (each compared in constant time, all of them every time); the principal it names goes into the scope."""

    def __init__(self, app: ASGIApp, principals: Principals) -> None:
        self.app = app
        self.principals = [(token.encode(), name) for token, name in principals.items()]

    def principal(self, given: bytes) -> tuple[bool, str | None]:
        found: tuple[bool, str | None] = (False, None)
        for token, name in self.principals:
            if hmac.compare_digest(given, token):
                found = (True, name)
        return found

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            token = bearer_token(headers.get(b"authorization", b""))
            known, name = self.principal(token) if token is not None else (False, None)
            if not known:
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
            scope[PRINCIPAL_SCOPE] = name
            # The SDK binds an MCP session to the principal that opened it (its ``authorization_context``).
            scope["user"] = AuthenticatedUser(AccessToken(token="", client_id=name or "", scopes=[]))
        await self.app(scope, receive, send)


def build_app(
    server: MCPServer[Any], host: str, port: int, principals: Principals | None, allowed_hosts: Sequence[str]
) -> Any:
    if not is_loopback(host) and not principals:
        raise HttpConfigError(
            f"Refusing to serve on {host}, which is not a loopback address, without authentication: anyone who can "
            f"reach it could run the model. Set --auth-tokens FILE (or {TOKEN_ENV}), or bind 127.0.0.1 and tunnel "
            "(ssh -L)."
        )
    app = server.streamable_http_app(host=host, transport_security=security_settings(host, port, allowed_hosts))
    return BearerAuth(app, principals) if principals else app


def run_http(
    server: MCPServer[Any], host: str, port: int, principals: Principals | None, allowed_hosts: Sequence[str]
) -> None:
    import uvicorn

    app = build_app(server, host, port, principals, allowed_hosts)
    named = sorted(name for name in (principals or {}).values() if name)
    auth = f"bearer, principals {', '.join(named)}" if named else ("bearer" if principals else "none")
    log.info("serving MCP over streamable HTTP at http://%s:%d/mcp (auth: %s)", host, port, auth)
    uvicorn.run(app, host=host, port=port, log_level="info")
