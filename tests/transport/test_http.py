"""Streamable HTTP on loopback: a real client, DNS-rebinding protection, bearer-token auth."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mcp_interp.app.http import build_app, is_loopback
from mcp_interp.app.tokens import single_token
from mcp_interp.errors import HttpConfigError

TOKEN = "test-token-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(tmp_path: Path, *extra: str, env_extra: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MCP_INTERP_OUTPUT": str(tmp_path / "out")}
    env.pop("MCP_INTERP_AUTH_TOKEN", None)
    env.update(env_extra or {})
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mcp_interp",
            "serve",
            "--model",
            "tiny",
            "--transport",
            "http",
            "--port",
            str(port),
            *extra,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(process.stderr.read().decode() if process.stderr else "server exited")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return process, port
        time.sleep(0.2)
    process.kill()
    raise TimeoutError("HTTP server did not start")


@pytest.fixture
def plain_server(tmp_path: Path) -> Iterator[int]:
    process, port = start(tmp_path)
    yield port
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture
def token_server(tmp_path: Path) -> Iterator[int]:
    process, port = start(tmp_path, "--auth-token", TOKEN)
    yield port
    process.terminate()
    process.wait(timeout=30)


@pytest.mark.anyio
async def test_http_client_lists_and_calls(plain_server: int) -> None:
    url = f"http://127.0.0.1:{plain_server}/mcp"
    async with Client(url, read_timeout_seconds=120) as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        result = await client.call_tool("model_info", {})
    assert "patch_heads" in tools
    assert not result.is_error and result.structured_content["source"] == "tiny"


def test_dns_rebinding_protection_rejects_foreign_host(plain_server: int) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    headers = {"Host": "evil.example:80", "Accept": "application/json, text/event-stream"}
    response = httpx2.post(f"http://127.0.0.1:{plain_server}/mcp", json=body, headers=headers, timeout=30)
    assert response.status_code in (403, 421), response.status_code


@pytest.mark.anyio
async def test_bearer_token_required(token_server: int) -> None:
    url = f"http://127.0.0.1:{token_server}/mcp"
    body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    accept = {"Accept": "application/json, text/event-stream"}
    assert httpx2.post(url, json=body, headers=accept, timeout=30).status_code == 401
    wrong = {**accept, "Authorization": "Bearer not-the-token-at-all"}
    assert httpx2.post(url, json=body, headers=wrong, timeout=30).status_code == 401
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
    async with http, Client(streamable_http_client(url, http_client=http), read_timeout_seconds=120) as client:
        result = await client.call_tool("tokenize", {"texts": ["mary"]})
    assert not result.is_error


def test_non_loopback_bind_needs_a_token(tmp_path: Path) -> None:
    from mcp_interp.host import ModelHost
    from mcp_interp.mcp.server import build_server

    server = build_server(ModelHost("tiny", tmp_path / "out"))
    with pytest.raises(HttpConfigError, match="auth-token"):
        build_app(server, "0.0.0.0", 8000, None, [])
    with pytest.raises(HttpConfigError, match="16 characters"):
        single_token("short")
    for spaced in (" " * 16, "sixteen-chars-or more"):
        with pytest.raises(HttpConfigError, match="whitespace"):
            single_token(spaced)
    assert single_token("") is None and single_token(None) is None  # an empty variable counts as unset
    assert build_app(server, "0.0.0.0", 8000, single_token(TOKEN), []) is not None
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    done = subprocess.run(
        [sys.executable, "-m", "mcp_interp", "serve", "--model", "tiny", "--transport", "http", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MCP_INTERP_AUTH_TOKEN": ""},
    )
    assert done.returncode == 2 and "auth-token" in done.stderr
