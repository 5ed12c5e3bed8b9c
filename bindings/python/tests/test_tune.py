"""Real contests on this CPU from Python: the Python executors and LayerZero's own measured
into one PerfDB by `layerzero.tune`, a table solved from it, served to the Python host."""

import json

import pytest

torch = pytest.importorskip("torch")

import layerzero as lz  # noqa: E402

WORKLOAD = {
    "schema_version": 1,
    "name": "python-tiny-decode",
    "description": "One decode bucket of multi-head f32 attention: every CPU attention kernel contests.",
    "entries": [
        {
            "name": "decode",
            "request": {
                "op": "attention",
                "tensors": {
                    "q": {"dtype": "f32", "shape": [1, 1, 4, 64], "layout": "BSHD"},
                    "k": {"dtype": "f32", "shape": [1, 200, 4, 64], "layout": "BSHD"},
                    "v": {"dtype": "f32", "shape": [1, 200, 4, 64], "layout": "BSHD"},
                },
                "attrs": {"causal": True},
            },
            "ranges": {"seq_k": [200, 256]},
        }
    ],
}


def test_python_and_rust_kernels_contest_and_the_solved_plan_serves_the_winner(tmp_path):
    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps(WORKLOAD))
    perfdb = tmp_path / "perfdb.sqlite"
    report = lz.tune(workload, perfdb=perfdb, budget=120, verify=True)
    timed = {r["kernel"] for r in report["results"] if r.get("median_ns")}
    assert {"cpu.attention.flash", "torch_sdpa.attention.math_cpu", "torch_sdpa.attention.flash_cpu"} <= timed, timed
    assert report["rows_written"] >= 3
    verify = report["verify"]
    assert verify["verified"] >= 1
    bucket = verify["buckets"][0]
    assert len([t for t in bucket["times"] if t["median_ns"]]) >= 3
    # The regret is measured, not assumed: the PerfDB-backed pick's time over the fastest's.
    assert verify["perfdb"]["worst"] >= 0.0

    table = tmp_path / "table.json"
    entries, unsolved = lz.solve(workload, table, perfdb=perfdb)
    assert entries >= 1 and unsolved == 0
    winner = json.loads(table.read_text())["entries"][0]["kernel"]
    served = lz.LayerZero.host().with_plan(str(table), "strict")
    q = torch.randn(1, 1, 4, 64)
    k = torch.randn(1, 230, 4, 64)
    assert served.which("attention", q=q, k=k, v=k, causal=True) == winner
    out = lz.ops.attention(q, k, k, causal=True, handle=served)
    assert served.counters()["plan_hits"] >= 2 and served.counters()["live"] == 0
    want = torch.nn.functional.scaled_dot_product_attention(
        q.double().transpose(1, 2), k.double().transpose(1, 2), k.double().transpose(1, 2)
    ).transpose(1, 2)
    torch.testing.assert_close(out.double(), want, atol=1e-4, rtol=1e-4)


def test_a_bad_budget_is_refused_naming_the_argument(tmp_path):
    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps(WORKLOAD))
    with pytest.raises(lz.InvalidInputError, match="budget"):
        lz.tune(workload, perfdb=tmp_path / "p.sqlite", budget=-1)


def test_tuning_under_a_named_profile_ranks_with_its_model_and_fits_a_calibration_for_it(tmp_path):
    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps(WORKLOAD))
    calibration = tmp_path / "calibration.json"
    report = lz.tune(workload, perfdb=tmp_path / "p.sqlite", budget=120, verify=True, calibrate=calibration, hardware="zen4")
    # The model and its calibration are the named profile's; the times are this machine's.
    assert report["hardware"] == "zen4"
    fitted = json.loads(calibration.read_text())
    assert fitted["hardware"] == "zen4" and fitted["workload"] == "python-tiny-decode"
    assert any(f["kernel"] == "cpu.attention.flash" for f in fitted["kernels"]), fitted["kernels"]
    assert report["verify"]["calibrated"] is not None


def test_an_unknown_profile_is_refused_naming_it(tmp_path):
    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps(WORKLOAD))
    with pytest.raises(lz.LayerZeroError, match="no-such-gpu"):
        lz.tune(workload, perfdb=tmp_path / "p.sqlite", budget=5, hardware="no-such-gpu")
