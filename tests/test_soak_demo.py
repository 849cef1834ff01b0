"""The demo soak (bench/soak_demo.py) in its short form: five minutes of keyed churn, followers,
websocket browsers, uploads, table operations and abandoned sessions against `tickwire demo` with a
data directory. What it must show is behaviour: every kind of client did its work without an error,
and at the end the churned table, read fresh and as followed all along by a reconnecting
subscriber, equals what its writer had acknowledged. (Its figures, the slopes of RSS, descriptors
and threads and the latency, are the long form's report, not asserted here.)"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow]


def test_five_minutes_of_everything_lose_nothing(tmp_path):
    report = tmp_path / "soak.json"
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "soak_demo.py"), "--quick", "--report", str(report)],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads(report.read_text())
    assert out["errors"] == [] and out["counts"]["errors"] == 0, out["errors"]
    assert all(out["counts"][k] > 0 for k in ("churn_batches", "followers", "browsers", "uploads", "operations",
                                               "abandoned_sessions")), out["counts"]
    assert out["snapshot_equals_acknowledged"] and out["follower_equals_acknowledged"], out
    assert out["acknowledged_keys"] == 100_000
    # every sample read the server's memory figures from its /metrics
    assert all(s["arrow_mb"] >= 0 and s["py_blocks"] > 0 for s in out["series"]), out["series"]
    # the follower measured latency on updates it received (how many fall in each sample's period
    # depends on the machine's load, so it is not asserted per period)
    assert out["samples"] >= 10 and sum(s["lat_n"] for s in out["series"]) > 0, [s["lat_n"] for s in out["series"]]
