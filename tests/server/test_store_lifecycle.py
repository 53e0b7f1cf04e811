"""The store's lifecycle: eviction past the bound says so (tombstones), a read refreshes an entry (LRU), a referenced
entry outlives its bound while its referrer lives, and several processes sharing one folder lose nothing silently."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from mcp_interp.errors import NotFound
from mcp_interp.state.store import Store


def age(store: Store, kind: str, entry_id: str, seconds: int) -> None:
    """Give an entry a last-use time ``seconds`` after the epoch (so the order of use is explicit, never a tie)."""
    os.utime(store.path(kind, entry_id), ns=(seconds * 10**9, seconds * 10**9))


def not_found_message(store: Store, kind: str, entry_id: str) -> str:
    with pytest.raises(NotFound) as caught:
        store.get(kind, entry_id)
    return str(caught.value)


def test_an_evicted_entry_says_when_and_why_in_other_words_than_a_never_stored_id(tmp_path: Path) -> None:
    store = Store(tmp_path, max_entries=2)
    before = datetime.now(UTC).replace(microsecond=0)
    first = store.put("figure", b"first").id
    age(store, "figure", first, 1)
    second = store.put("figure", b"second").id
    age(store, "figure", second, 2)
    third = store.put("figure", b"third").id  # three entries, bound two: the least recently used one goes
    after = datetime.now(UTC)

    assert sorted(store.ids("figure")) == sorted([second, third])
    evicted = not_found_message(store, "figure", first)
    assert f"figure://{first} was evicted at " in evicted
    # why: the bound, the kind, and how to raise it
    assert "keeps the 2 most recently used figure entries" in evicted
    assert "MCP_INTERP_STORE_MAX_FIGURE" in evicted
    assert "Run the tool again" in evicted
    # when: an ISO timestamp taken during the put that evicted it
    stamp = datetime.fromisoformat(evicted.split(" was evicted at ")[1].split(": ")[0])
    assert before <= stamp <= after + timedelta(seconds=1)

    never = not_found_message(store, "figure", "0123456789abcdef" * 2)
    assert "was ever stored here" in never
    assert "was evicted" not in never
    assert "was ever stored" not in evicted
    # The survivors still read back, byte for byte.
    assert store.get("figure", second) == b"second" and store.get("figure", third) == b"third"
    # A restarted server (a new Store on the folder) gives the same account of the evicted id.
    assert not_found_message(Store(tmp_path, max_entries=2), "figure", first) == evicted


def test_a_read_refreshes_an_entry_so_the_least_recently_used_goes_instead(tmp_path: Path) -> None:
    store = Store(tmp_path, max_entries=3)
    a, b, c = (store.put("report", name.encode()).id for name in "abc")
    for seconds, entry_id in enumerate([a, b, c], start=1):
        age(store, "report", entry_id, seconds)  # written in the order a, b, c: a is the oldest
    assert store.get("report", a) == b"a"  # ... until it is read
    d = store.put("report", b"d").id

    assert sorted(store.ids("report")) == sorted([a, c, d])
    assert "was evicted at" in not_found_message(store, "report", b)
    assert store.get("report", a) == b"a"


def test_without_a_read_the_oldest_goes(tmp_path: Path) -> None:
    """The control for the LRU test above: the same writes with no read evict ``a``."""
    store = Store(tmp_path, max_entries=3)
    a, b, c = (store.put("report", name.encode()).id for name in "abc")
    for seconds, entry_id in enumerate([a, b, c], start=1):
        age(store, "report", entry_id, seconds)
    d = store.put("report", b"d").id
    assert sorted(store.ids("report")) == sorted([b, c, d])
    assert "was evicted at" in not_found_message(store, "report", a)


def test_a_referenced_entry_stays_while_its_referrer_lives_and_can_go_once_it_is_evicted(tmp_path: Path) -> None:
    store = Store(tmp_path, max_entries={"figure": 2, "report": 1})
    f1 = store.put("figure", b"f1")
    age(store, "figure", f1.id, 1)
    report = store.put("report", b"# report with f1", references=[f1.uri])
    age(store, "report", report.id, 1)
    f2 = store.put("figure", b"f2")
    age(store, "figure", f2.id, 2)
    f3 = store.put("figure", b"f3")  # bound exceeded: f1 is the oldest, but the report links to it
    age(store, "figure", f3.id, 3)

    assert sorted(store.ids("figure")) == sorted([f1.id, f3.id])
    assert store.get("figure", f1.id) == b"f1"
    age(store, "figure", f1.id, 1)  # undo the read's refresh: f1 stays the least recently used figure
    assert "was evicted at" in not_found_message(store, "figure", f2.id)
    assert f1.uri in store.referenced()

    store.put("report", b"# another report")  # the report bound is one: the referring report goes
    assert "was evicted at" in not_found_message(store, "report", report.id)
    assert f1.uri not in store.referenced()
    f4 = store.put("figure", b"f4")  # now nothing protects f1, the least recently used figure

    assert sorted(store.ids("figure")) == sorted([f3.id, f4.id])
    assert "was evicted at" in not_found_message(store, "figure", f1.id)


def test_a_referenced_entry_may_hold_its_kind_over_the_bound(tmp_path: Path) -> None:
    """Protection wins over the bound: a server restarted with a bound of one figure keeps the two figures a live
    job references; the one evictable figure goes (even the one just written)."""
    store = Store(tmp_path, max_entries=3)
    figures = [store.put("figure", bytes([i])) for i in range(2)]
    store.put("job", b"{}", references=[f.uri for f in figures])
    for seconds, figure in enumerate(figures, start=1):
        age(store, "figure", figure.id, seconds)
    smaller = Store(tmp_path, max_entries={"figure": 1})
    extra = smaller.put("figure", b"extra")
    assert sorted(smaller.ids("figure")) == sorted(f.id for f in figures)
    assert "was evicted at" in not_found_message(smaller, "figure", extra.id)
    assert [smaller.get("figure", f.id) for f in figures] == [bytes([0]), bytes([1])]


WORKER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from mcp_interp.state.store import Store
    from mcp_interp.errors import NotFound

    root, name, count, bound = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    store = Store(root, max_entries=bound)
    while not (root / "go").exists():  # every process starts putting at the same moment
        time.sleep(0.001)
    ids, failures, reads = [], [], {"back": 0, "evicted": 0}
    for i in range(count):
        try:
            entry_id = store.put("result", f"{name}-{i}".encode()).id
        except BaseException as exc:  # nothing may escape put
            failures.append(f"put {i}: {type(exc).__name__}: {exc}")
            continue
        ids.append(entry_id)
        try:  # read back at once, while the other processes evict
            data = store.get("result", entry_id)
            if data != f"{name}-{i}".encode():
                failures.append(f"read {i}: wrong bytes {data!r}")
            reads["back"] += 1
        except NotFound as exc:
            if "was evicted at" not in str(exc):
                failures.append(f"read {i}: silently lost: {exc}")
            reads["evicted"] += 1
        except BaseException as exc:
            failures.append(f"read {i}: {type(exc).__name__}: {exc}")
    print(json.dumps({"name": name, "ids": ids, "failures": failures, "reads": reads}))
    """
)


def test_three_processes_sharing_one_folder_lose_nothing_silently(tmp_path: Path) -> None:
    processes, per_process, bound = 3, 40, 12  # 120 puts; the tombstones (10 × bound) cover every eviction
    root = tmp_path / "store"
    Store(root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(root), f"p{n}", str(per_process), str(bound)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for n in range(processes)
    ]
    time.sleep(0.5)  # let them import and wait at the start line
    (root / "go").touch()
    reports = []
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err.decode(errors="replace")[-2000:]
        reports.append(json.loads(out))

    assert [r["failures"] for r in reports] == [[], [], []]
    assert [len(r["ids"]) for r in reports] == [per_process] * processes
    store = Store(root, max_entries=bound)
    back, evicted = [], []
    for report in reports:
        for i, entry_id in enumerate(report["ids"]):
            try:
                assert store.get("result", entry_id) == f"{report['name']}-{i}".encode()
                back.append(entry_id)
            except NotFound as exc:
                assert "was evicted at" in str(exc), f"{report['name']}-{i} was lost silently: {exc}"
                evicted.append(entry_id)
    # Every write happened before the last eviction ran (each put evicts after its own write, under the lock), so
    # exactly `bound` entries remain and every other one has a tombstone.
    assert len(back) == bound and len(evicted) == processes * per_process - bound
    assert sorted(store.ids("result")) == sorted(back)
    assert len(set(back) | set(evicted)) == processes * per_process  # 120 distinct ids
    assert not list((root / "result").glob(".tmp-*"))
