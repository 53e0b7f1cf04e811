"""A reduced soak (the full 500-call run is `python scripts/soak.py`): memory, descriptors and the
store stay flat over many mixed calls in one stdio session."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from soak import soak


def test_reduced_soak_stays_flat() -> None:
    result = soak(model="tiny", calls=130, warmup=60, store_max=20)
    before, after = result["before"], result["after"]
    print(
        f"\nsoak (reduced): RSS {before.rss_mb:.1f} -> {after.rss_mb:.1f} MB ({result['rss_growth_pct']:+.2f} %), "
        f"fds {before.fds} -> {after.fds}, figures {after.figures}/{result['store_max']}"
    )
    assert result["tool_errors"] > 0, "the mix must include bad calls"
    assert after.fds <= before.fds
    assert after.figures <= 20 and after.reports <= 20
    assert result["rss_growth_pct"] <= 5.0
