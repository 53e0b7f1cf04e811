"""Raw stdio, byte by byte: `mcp-interp serve --model tiny` answers every line a client sends — invalid JSON, a batch,
a request that is not JSON-RPC, a lone surrogate — within a second, logs each rejected line to stderr, and keeps
serving (a ping afterwards is answered).

What the answers are (``mcp_interp/stdio.py``, JSON-RPC 2.0 §5.1 and MCP 2025-06-18, which removed batching):
not JSON → -32700 parse error with ``id: null``; a JSON array → -32600 invalid request with ``id: null`` (none of the
batch's requests runs); a lone UTF-16 surrogate in a ``tools/call``'s arguments → a tool error result
(``isError: true``) naming the argument, elsewhere → -32700 with the request's id; a malformed notification → no
answer (nothing may answer a notification), only the log line.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPLY_WITHIN_S = 1.0


class RawServer:
    """The server as a subprocess; a thread reads each stdout line (each must be a JSON-RPC message), another
    collects stderr, so waiting for a reply is a queue read with a timeout and a missing one fails fast."""

    def __init__(self, tmp_path: Path) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "MCP_INTERP_OUTPUT": str(tmp_path / "out")}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mcp_interp", "serve", "--model", "tiny"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        self.not_json_rpc: list[bytes] = []
        self.stderr: list[str] = []
        self.seen: list[dict[str, Any]] = []  # every message read so far, in order
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                self.not_json_rpc.append(line)
                continue
            if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
                self.not_json_rpc.append(line)
                continue
            self.messages.put(message)

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr.append(line.decode("utf-8", errors="replace"))

    def send(self, line: bytes) -> float:
        assert self.process.stdin is not None
        self.process.stdin.write(line.rstrip(b"\n") + b"\n")
        self.process.stdin.flush()
        return time.monotonic()

    def request(self, request_id: int, method: str, params: dict[str, Any] | None = None) -> float:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        return self.send(json.dumps(message).encode())  # ensure_ascii: a lone surrogate goes as the escape \ud800

    def wait_for(self, matches: Callable[[dict[str, Any]], bool], sent: float, within: float) -> dict[str, Any]:
        """The first message (after those already taken) that ``matches``, if it arrives within ``within`` seconds
        of ``sent``; otherwise the test fails, showing stderr's tail."""
        for message in self.seen:
            if matches(message) and not message.get("_taken"):
                message["_taken"] = True
                return message
        while True:
            left = sent + within - time.monotonic()
            try:
                message = self.messages.get(timeout=max(left, 0.0))
            except queue.Empty:
                pytest.fail(f"no matching reply within {within} s; stderr:\n{''.join(self.stderr[-30:])}")
            self.seen.append(message)
            if matches(message):
                message["_taken"] = True
                return message

    def logged(self, text: str, sent: float, within: float = REPLY_WITHIN_S) -> str:
        while time.monotonic() < sent + within:
            found = [line for line in self.stderr if text in line]
            if found:
                return found[-1]
            time.sleep(0.01)
        pytest.fail(f"stderr has no line with {text!r}:\n{''.join(self.stderr[-30:])}")

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()  # EOF: the server stops
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)


def reply_to(request_id: int | None) -> Callable[[dict[str, Any]], bool]:
    return lambda m: "method" not in m and ("result" in m or "error" in m) and m.get("id", "absent") == request_id


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RawServer]:
    raw = RawServer(tmp_path)
    try:
        init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
        sent = raw.request(1, "initialize", init)
        reply = raw.wait_for(reply_to(1), sent, within=180)  # the first answer waits for the imports
        assert reply["result"]["protocolVersion"] == "2025-06-18", reply
        raw.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')
        sent = raw.request(2, "ping")
        assert raw.wait_for(reply_to(2), sent, within=60)["result"] == {}
        yield raw
    finally:
        raw.close()
    assert raw.not_json_rpc == [], raw.not_json_rpc  # nothing but JSON-RPC ever reached stdout


def test_garbage_a_batch_and_a_lone_surrogate_each_get_an_answer_in_a_second(server: RawServer) -> None:
    # 1. Not JSON: -32700, id null (the id cannot be read), and a log line.
    sent = server.send(b'{"jsonrpc": "2.0", "id": 3, "method": "ping"')  # the closing brace is missing
    garbage = server.wait_for(reply_to(None), sent, REPLY_WITHIN_S)
    assert garbage["error"]["code"] == -32700 and garbage["id"] is None
    assert garbage["error"]["message"].startswith("Parse error")
    assert "rejected an input line (-32700)" in server.logged("rejected an input line (-32700)", sent)

    # 2. A batch (an array of requests): -32600, id null; none of its requests is run.
    batch = [{"jsonrpc": "2.0", "id": 4, "method": "ping"}, {"jsonrpc": "2.0", "id": 5, "method": "tools/list"}]
    sent = server.send(json.dumps(batch).encode())
    refused = server.wait_for(reply_to(None), sent, REPLY_WITHIN_S)
    assert refused["error"]["code"] == -32600 and refused["id"] is None
    assert "batches are not supported" in refused["error"]["message"]
    server.logged("rejected an input line (-32600)", sent)

    # 3. A lone surrogate in a tool's arguments: a tool error (a result, isError) naming the argument.
    sent = server.request(6, "tools/call", {"name": "tokenize", "arguments": {"texts": ["mary", "\ud800 went"]}})
    surrogate = server.wait_for(reply_to(6), sent, REPLY_WITHIN_S)
    assert "error" not in surrogate and surrogate["result"]["isError"] is True
    text = surrogate["result"]["content"][0]["text"]
    assert "Argument `texts[1]` holds a lone UTF-16 surrogate" in text and "'tokenize'" in text
    server.logged("rejected an input line (tool error)", sent)

    # 4. Afterwards the server still answers.
    sent = server.request(7, "ping")
    assert server.wait_for(reply_to(7), sent, REPLY_WITHIN_S)["result"] == {}
    assert not [m for m in server.seen if m.get("id") in (3, 4, 5)]  # the broken line and the batch ran nothing


def test_other_malformed_lines_are_answered_or_logged(server: RawServer) -> None:
    # JSON that is not a request object: -32600 (with the id when there is one).
    sent = server.send(b"42")
    assert server.wait_for(reply_to(None), sent, REPLY_WITHIN_S)["error"]["code"] == -32600
    sent = server.send(b'{"id": 8, "method": "ping"}')  # no "jsonrpc": "2.0"
    not_rpc = server.wait_for(reply_to(8), sent, REPLY_WITHIN_S)
    assert not_rpc["error"]["code"] == -32600 and "result" not in not_rpc
    # A lone surrogate outside a tool's arguments: -32700 with the request's id, naming where it is.
    sent = server.request(9, "ping", {"_meta": {"note": "\udc00"}})
    elsewhere = server.wait_for(reply_to(9), sent, REPLY_WITHIN_S)
    assert elsewhere["error"]["code"] == -32700 and "`params._meta.note`" in elsewhere["error"]["message"]
    # NaN is not JSON.
    sent = server.send(b'{"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {"name": "x", "y": NaN}}')
    nan = server.wait_for(reply_to(None), sent, REPLY_WITHIN_S)
    assert nan["error"]["code"] == -32700
    # A malformed notification: nothing may answer it; it is logged and dropped.
    sent = server.send(b'{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": 5}')
    server.logged("rejected an input line (dropped)", sent)
    sent = server.request(11, "ping")
    assert server.wait_for(reply_to(11), sent, REPLY_WITHIN_S)["result"] == {}
    answered = [m.get("id") for m in server.seen if "method" not in m]
    assert answered.count(None) == 2 and 10 not in answered  # 42 and the NaN line; nothing for the notification
