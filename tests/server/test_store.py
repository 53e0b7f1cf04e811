"""The figure/report store: hostile ids never touch a file; writes are atomic; it is bounded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcp_interp.errors import NotFound
from mcp_interp.state.store import ID_PATTERN, Store


def test_put_get_roundtrip_and_uri(tmp_path: Path) -> None:
    store = Store(tmp_path)
    stored = store.put("figure", b"png bytes")
    assert ID_PATTERN.fullmatch(stored.id)
    assert stored.uri == f"figure://{stored.id}"
    assert store.get("figure", stored.id) == b"png bytes"
    # A new Store on the same folder (a restarted server) still resolves it.
    assert Store(tmp_path).get("figure", stored.id) == b"png bytes"


@pytest.mark.parametrize(
    "bad",
    ["../../etc/passwd", "..", "", "A" * 32, "0" * 31, "0" * 33, "0" * 32 + "/x", "%2e%2e", "x" * 10_000, "\x00" * 32],
)
def test_malformed_ids_are_not_found_without_touching_files(
    tmp_path: Path, bad: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(tmp_path)
    opened: list[str] = []
    real_read = Path.read_bytes

    def spy(self: Path) -> bytes:
        opened.append(str(self))
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", spy)
    with pytest.raises(NotFound):
        store.get("figure", bad)
    assert opened == []


def test_unknown_but_wellformed_id_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="was ever stored here"):
        Store(tmp_path).get("figure", "0" * 32)


def test_unknown_kind_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        Store(tmp_path).get("../figure", "0" * 32)


def test_oldest_entries_are_evicted_beyond_the_bound(tmp_path: Path) -> None:
    store = Store(tmp_path, max_entries=3)
    ids = []
    for i in range(5):
        stored = store.put("figure", bytes([i]))
        path = tmp_path / "figure" / f"{stored.id}.png"
        os.utime(path, ns=(i * 10**9, i * 10**9))  # distinct, increasing mtimes
        ids.append(stored.id)
    store.put("report", b"unaffected")
    assert store.ids("figure") == ids[2:]
    with pytest.raises(NotFound):
        store.get("figure", ids[0])
    assert len(store.ids("report")) == 1


def test_no_temp_files_left_after_writes(tmp_path: Path) -> None:
    store = Store(tmp_path)
    for _ in range(3):
        store.put("report", b"# report")
    assert not [p for p in (tmp_path / "report").iterdir() if p.name.startswith(".tmp-")]


def test_a_writer_killed_mid_write_leaves_no_entry_and_its_temp_is_cleaned(tmp_path: Path) -> None:
    import subprocess
    import sys
    import textwrap

    # A real process that starts writing a figure and is killed before the rename.
    script = textwrap.dedent(
        f"""
        import os, tempfile, time
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".png", dir={str(tmp_path / "figure")!r})
        os.write(fd, b"half a png")
        print("writing", flush=True)
        time.sleep(60)
        """
    )
    Store(tmp_path)
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline().strip() == b"writing"
    process.kill()
    process.wait()
    store = Store(tmp_path)
    assert store.ids("figure") == []
    leftovers = list((tmp_path / "figure").glob(".tmp-*"))
    assert len(leftovers) == 1  # too young to delete: another server might own it
    os.utime(leftovers[0], (0, 0))
    Store(tmp_path)
    assert list((tmp_path / "figure").glob(".tmp-*")) == []


def test_store_bound_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_INTERP_STORE_MAX", "2")
    store = Store(tmp_path)
    for _ in range(4):
        store.put("report", b"x")
    assert len(store.ids("report")) == 2
