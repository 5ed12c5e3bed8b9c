"""Ranks agree before serving (torch.distributed over gloo, 4 processes on this machine)."""

import json
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as tmp  # noqa: E402

WORKLOAD = {
    "schema_version": 1,
    "name": "agree",
    "description": "Two decode buckets of attention.",
    "entries": [
        {
            "name": "decode",
            "request": {
                "op": "attention",
                "tensors": {
                    "q": {"dtype": "f32", "shape": [1, 1, 4, 64], "layout": "BSHD"},
                    "k": {"dtype": "f32", "shape": [1, 64, 4, 64], "layout": "BSHD"},
                    "v": {"dtype": "f32", "shape": [1, 64, 4, 64], "layout": "BSHD"},
                },
                "attrs": {"causal": True},
            },
            "ranges": {"seq_k": [64, 128]},
        }
    ],
}


def _rank(rank, size, store, folder, results, odd_rank):
    import layerzero as lz
    import layerzero.distributed as lzd

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        handle = None
        if rank == odd_rank:
            policy = os.path.join(folder, "odd.json")
            with open(policy, "w") as f:
                json.dump({"rules": [{"action": "deny", "kernels": "cpu.attention.*"}]}, f)
            handle = lz.LayerZero.host().with_policy(policy)
        try:
            lz.distributed.agree(handle, workload=os.path.join(folder, "workload.json"))
            results[rank] = "agreed"
        except lz.PlanMismatchError as e:
            results[rank] = "mismatch: " + str(e)
    except Exception as e:  # noqa: BLE001 - reported to the test
        results[rank] = f"error: {type(e).__name__}: {e}"
    finally:
        dist.destroy_process_group()


def _spawn(target, size, *extra):
    """Runs ``target(rank, size, store, folder, results, *extra)`` in ``size`` spawned
    processes over one gloo store, with the test workload in ``folder``; fails the test if a
    rank hangs. Returns what each rank put in ``results``."""
    folder = tempfile.mkdtemp(prefix="lz-ranks-")
    with open(os.path.join(folder, "workload.json"), "w") as f:
        json.dump(WORKLOAD, f)
    store = os.path.join(folder, "store")
    ctx = tmp.get_context("spawn")
    results = ctx.Manager().dict()
    procs = [ctx.Process(target=target, args=(r, size, store, folder, results) + extra) for r in range(size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    hung = [p for p in procs if p.is_alive()]
    for p in hung:
        p.kill()
    if hung:
        pytest.fail(f"{len(hung)} rank(s) hung")
    return dict(results)


def _launch(odd_rank):
    return _spawn(_rank, 4, odd_rank)


def test_four_ranks_with_the_same_handle_agree():
    results = _launch(odd_rank=None)
    assert results == {r: "agreed" for r in range(4)}, results


def test_one_rank_with_another_policy_fails_every_rank_naming_the_policy_and_the_buckets():
    results = _launch(odd_rank=1)
    assert sorted(results) == [0, 1, 2, 3], results
    for rank, text in results.items():
        assert text.startswith("mismatch: "), (rank, text)
        assert "policy: " in text and "rank 1 has" in text, text
        assert "bucket:decode" in text and "cpu.attention.flash" in text, text
    # Every rank reports the same thing.
    assert len(set(results.values())) == 1


def _solve_rank(rank, size, store, folder, results):
    import layerzero as lz
    import layerzero.distributed as lzd

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        workload = os.path.join(folder, "workload.json")
        handle = lzd.solve(workload, folder=os.path.join(folder, f"plans{rank}"))
        q = torch.randn(1, 1, 4, 64)
        k = torch.randn(1, 100, 4, 64)
        kernel = handle.which("attention", q=q, k=k, v=k, causal=True)
        lz.ops.attention(q, k, k, causal=True, handle=handle)
        c = handle.counters()
        results[rank] = (kernel, c["plan_hits"], c["live"])
    except Exception as e:  # noqa: BLE001 - reported to the test
        results[rank] = f"error: {type(e).__name__}: {e}"
    finally:
        dist.destroy_process_group()


def test_the_root_solves_and_every_rank_serves_its_plan():
    got = _spawn(_solve_rank, 3)
    assert sorted(got) == [0, 1, 2], got
    kernels = {v[0] for v in got.values() if isinstance(v, tuple)}
    assert len(kernels) == 1, got
    for rank, (kernel, plan_hits, live) in got.items():
        assert plan_hits >= 2 and live == 0, (rank, plan_hits, live)


def _dying_rank(rank, size, store, folder, results):
    import datetime
    import time

    import layerzero.distributed as lzd

    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=size, timeout=datetime.timedelta(seconds=10)
    )
    if rank == 2:
        os._exit(0)  # dies before agreeing, without a word to the others
    start = time.perf_counter()
    try:
        lzd.agree(workload=os.path.join(folder, "workload.json"))
        results[rank] = ("agreed", time.perf_counter() - start)
    except Exception as e:  # noqa: BLE001 - what the survivors see
        results[rank] = (f"{type(e).__name__}: {e}", time.perf_counter() - start)


def test_a_rank_that_dies_mid_agreement_is_an_error_on_the_others_within_seconds():
    results = _spawn(_dying_rank, 3)
    for rank in (0, 1):
        text, seconds = results[rank]
        assert text.startswith("IoError") and "did a rank die" in text, text
        assert seconds < 60, (rank, seconds, text)


def _capability_rank(rank, size, store, folder, results):
    import layerzero as lz
    import layerzero.distributed as lzd

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        # Two kinds of machine: ranks 0 and 1 plan for a Sapphire Rapids, 2 and 3 for a Zen 4.
        handle = lz.LayerZero.planning("spr" if rank < 2 else "zen4")
        report = lzd.agree_by_capability(handle=handle, workload=os.path.join(folder, "workload.json"))
        results[rank] = json.dumps(report, sort_keys=True)
        try:
            lzd.agree_by_capability(handle=lz.LayerZero.planning("spr" if rank < 2 else "zen4"), one_plan=rank == 3)
            results[(rank, "one_plan")] = "agreed"
        except lz.PlanMismatchError as e:
            results[(rank, "one_plan")] = "mismatch: " + str(e)
    except Exception as e:  # noqa: BLE001 - reported to the test
        results[rank] = f"error: {type(e).__name__}: {e}"
    finally:
        dist.destroy_process_group()


def test_capability_groups_each_agree_and_their_differences_are_reported():
    got = _spawn(_capability_rank, 4)
    reports = {got[r] for r in range(4)}
    assert len(reports) == 1, got  # every rank reports the same
    report = json.loads(reports.pop())
    assert sorted(sorted(r) for r in report["groups"].values()) == [[0, 1], [2, 3]], report
    assert "hardware" in report["differences"], report
    for r in range(4):
        assert got[(r, "one_plan")].startswith("mismatch: ") and "hardware" in got[(r, "one_plan")], got


MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "models")


def _solve_per_machine_rank(rank, size, store, folder, results):
    # Two kinds of machine for real: ranks 0 and 1 detect this CPU capped at AVX2.
    if rank < 2:
        os.environ["LAYERZERO_CPU_ISA"] = "avx2"
    import layerzero as lz
    import layerzero.distributed as lzd

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        mine = lzd.capability_group()
        handle = lzd.solve(os.path.join(folder, "workload.json"), mine, folder=os.path.join(folder, f"r{rank}"))
        table = lzd.facts(handle)["table"]
        results[rank] = (mine.size(), mine.rank(), table, lzd.facts(handle)["hardware"])
        dist.barrier()
    except Exception as e:  # noqa: BLE001 - reported to the test
        results[rank] = f"error: {type(e).__name__}: {e}"
    finally:
        dist.destroy_process_group()


def test_the_root_of_each_capability_group_solves_for_its_kind_of_machine():
    got = _spawn(_solve_per_machine_rank, 4)
    for rank in range(4):
        assert isinstance(got[rank], tuple), got
        assert got[rank][:2] == (2, rank % 2), got  # two ranks per group, in rank order
    assert got[0][2:] == got[1][2:] and got[2][2:] == got[3][2:], got  # one table per machine kind
    assert got[0][3] != got[2][3] and got[0][2] != got[2][2], got  # and the kinds differ


def _tp_rank(rank, size, store, folder, results):
    import layerzero as lz
    import layerzero.distributed as lzd

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        # What one rank of the model runs, as the tensor-parallel workload says.
        tp = os.path.join(folder, f"tp{size}.json")
        w = lz.workload(os.path.join(MODELS, "llama-gqa"), tp, tp=size, max_seq=32)
        attention = next(e for e in w["entries"] if e["name"].startswith("attention."))
        hq, kv_per, d = (attention["request"]["tensors"]["q"]["shape"][2],) + tuple(
            attention["request"]["tensors"]["k"]["shape"][2:4]
        )
        heads, kv_heads = hq * size, 2  # the model's: 4 query heads, 2 key/value heads
        g = torch.Generator().manual_seed(5)  # the same full tensors on every rank
        q = torch.randn(1, 24, heads, d, generator=g)
        k = torch.randn(1, 24, kv_heads, d, generator=g)
        v = torch.randn(1, 24, kv_heads, d, generator=g)
        # Megatron's split: rank r runs query heads [r*hq, (r+1)*hq) and the key/value heads
        # they read (replicated when there are fewer than ranks).
        kv0 = (rank * hq) // (heads // kv_heads)
        mine = lz.ops.attention(
            q[:, :, rank * hq : (rank + 1) * hq], k[:, :, kv0 : kv0 + kv_per], v[:, :, kv0 : kv0 + kv_per], causal=True
        )
        parts = [torch.empty_like(mine) for _ in range(size)]
        dist.all_gather(parts, mine.contiguous())
        gathered = torch.cat(parts, dim=2)
        whole = lz.ops.attention(q, k, v, causal=True)
        diff = (gathered - whole).abs().max().item()
        kernel = lz.which("attention", q=q[:, :, :hq], k=k[:, :, :kv_per], v=v[:, :, :kv_per], causal=True)
        lzd.agree(workload=tp)  # every bucket of the rank's workload
        results[rank] = (diff, kernel, hq, kv_per)
    except Exception as e:  # noqa: BLE001 - reported to the test
        results[rank] = f"error: {type(e).__name__}: {e}"
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("size", [2, 4])
def test_heads_split_over_ranks_gather_to_the_single_rank_output(size):
    got = _spawn(_tp_rank, size)
    assert sorted(got) == list(range(size)), got
    for rank, r in got.items():
        assert isinstance(r, tuple), (rank, r)
        assert r[0] <= 2e-5, (rank, r)
        assert r[2:] == (4 // size, max(2 // size, 1)), (rank, r)  # heads / N; KV heads replicated
    assert len({r[1] for r in got.values()}) == 1, got  # every rank selected the same kernel


def test_a_ranks_workload_from_python_is_the_model_split_over_tp(tmp_path):
    import layerzero as lz

    out = tmp_path / "tp2.json"
    w = lz.workload(os.path.join(MODELS, "llama-gqa"), out, tp=2, max_seq=32)
    assert w["name"].endswith(".tp2") and json.loads(out.read_text()) == w
    attention = next(e for e in w["entries"] if e["name"].startswith("attention."))
    assert attention["request"]["tensors"]["q"]["shape"][2] == 2
    assert attention["request"]["tensors"]["k"]["shape"][2] == 1
    with pytest.raises(lz.InvalidInputError, match="3"):
        lz.workload(os.path.join(MODELS, "llama-gqa"), tp=3)


def test_torchrun_four_ranks_agree_and_one_other_policy_fails_every_rank_naming_the_bucket(tmp_path):
    import subprocess
    import sys

    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps(WORKLOAD))
    script = os.path.join(os.path.dirname(__file__), "ranks_under_torchrun.py")
    for odd in ("none", "1"):
        run = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
            + [script, str(workload), odd, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        said = [line for line in run.stdout.splitlines() if line.startswith("rank ")]
        assert len(said) == 4, run.stdout + run.stderr
        if odd == "none":
            assert all(": agreed in " in line for line in said), said
        else:
            for line in said:
                assert ": PlanMismatchError: " in line and "bucket:decode" in line, line
                assert "rank 1 has" in line, line


def _readiness_rank(rank, size, store, folder, results):
    import layerzero as lz

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        handle = None
        if rank == 0:
            policy = os.path.join(folder, "odd.json")
            with open(policy, "w") as f:
                json.dump({"rules": [{"action": "deny", "kernels": "cpu.attention.*"}]}, f)
            handle = lz.LayerZero.host().with_policy(policy)
        checks = lz.readiness_check(group=True, handle=handle, workload=os.path.join(folder, "workload.json"))
        results[rank] = [c for c in checks if c["name"] == "distributed"][0]
    except Exception as e:  # noqa: BLE001 - reported to the test
        results[rank] = f"error: {type(e).__name__}: {e}"
    finally:
        dist.destroy_process_group()


def test_readiness_under_a_group_fails_its_distributed_check_when_ranks_differ():
    got = _spawn(_readiness_rank, 2)
    for rank in (0, 1):
        check = got[rank]
        assert isinstance(check, dict) and check["ok"] is False, got
        assert "policy" in check["detail"] and check["fix"], check
