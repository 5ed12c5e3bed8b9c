#!/usr/bin/env python3
"""LayerZero on a real GPU (issue 31): every step in one run, its report in a folder.

    tools/gpu_check.sh OUT_DIR          # the wrapper: finds `lz`, the package, Liger's wheel

Steps, each recorded in OUT_DIR/report.json (rewritten after every step, so a run cut short
keeps what it did) and summarized in OUT_DIR/report.md:

1. detection: `lz doctor --json` and `layerzero.doctor()` read the GPU through the driver;
   each field against the named `h100` profile and against torch's own reading; free memory
   through the driver against `torch.cuda.mem_get_info`.
2. kernels: `layerzero.selftest()` on the GPU, then torch SDPA's four CUDA backends, each
   forced by a lock policy, on the E2E §6.1 shapes (32/8 heads, head_dim 128, 128 to 32768
   tokens, prefill and decode, fp16 and bf16) through `layerzero.ops.attention`, each output
   held to float64 at §5's tolerances on sampled rows; what the default handle picks, also
   checked; §6.2 (paged) and §6.15 (Liger's RMSNorm, SwiGLU, RoPE) likewise; a
   `LAYERZERO_FAULTS` drill on the selected GPU kernel.
3. cost model: `layerzero.tune` of workloads/gpu-check-h100.json under the `h100` profile's
   model (restricted to what is installed here), verified, with a calibration fitted.
4. CUDA graphs: a decoder step through `torch.ops.layerzero` captured on a side stream and
   replayed against eager; graph-strict selection; the refusals and the no-kernel error.
5. models: a committed tiny Llama and a ~125M Llama (its config, seeded weights) through HF
   transformers with attn_implementation "layerzero" against "sdpa": logits, greedy tokens,
   tokens/s in the same run, interleaved.

Nothing here is asserted: every figure is recorded with its verdict, and a step that fails
records why and the run goes on.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# E2E §5: (rtol, atol) per category and dtype; a 16-bit output may also be one ulp off.
TOL = {
    "attention": {"float16": (1e-3, 1e-3), "bfloat16": (1e-2, 1e-2), "float32": (1e-5, 1e-5)},
    "norms": {"float16": (1e-3, 1e-3), "bfloat16": (1e-2, 1e-2), "float32": (1e-6, 1e-6)},
    "gemm": {"float16": (1e-3, 1e-3), "bfloat16": (1e-2, 1e-2), "float32": (1e-6, 1e-6)},
    "rope": {"float16": (1e-4, 1e-4), "bfloat16": (1e-3, 1e-3), "float32": (1e-6, 1e-6)},
}
ULP = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 0.0}
# Where the tensors go: "cuda", or "cpu" for a dry run of the script's own logic
# (`--dry-run-cpu`: no GPU kernel runs; refusals and the CPU kernels do).
DEV = "cuda"
# The report folder (the tuning report is written there whole).
OUTDIR = "."

SDPA = ["torch_sdpa.attention.flash", "torch_sdpa.attention.efficient", "torch_sdpa.attention.cudnn", "torch_sdpa.attention.math"]


class Report:
    def __init__(self, out):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.data = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "steps": {}}

    def step(self, name, fn, *args):
        print(f"== {name}", flush=True)
        t = time.time()
        try:
            result = fn(*args)
            entry = {"ok": True, "result": result}
        except Exception as e:  # noqa: BLE001 - a failed step is recorded, the run goes on
            entry = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-4000:]}
            print(entry["trace"], flush=True)
        entry["seconds"] = round(time.time() - t, 2)
        self.data["steps"][name] = entry
        self.save()
        return entry.get("result")

    def save(self):
        (self.out / "report.json").write_text(json.dumps(self.data, indent=1, default=str))
        (self.out / "report.md").write_text(markdown(self.data))


def close(got, want, category, dtype_name):
    """E2E §5 on float64 tensors: worst |got - want| / (atol + rtol |want|), ulp allowance
    included (<= 1 passes), and the max abs error."""
    import torch

    rtol, atol = TOL[category][dtype_name]
    d = (got - want).abs()
    bound = atol + rtol * want.abs()
    ulp = ULP[dtype_name] * torch.maximum(want.abs(), got.abs())
    ok_elem = (d <= bound) | (d <= ulp)
    ratio = (d / bound).max().item()
    nonfinite = int((~torch.isfinite(got)).sum().item())
    return {
        "ok": bool(ok_elem.all().item()) and nonfinite == 0,
        "max_abs_err": float(d.max().item()),
        "worst_ratio": float(ratio),
        "violations": int((~ok_elem).sum().item()),
        "nonfinite": nonfinite,
    }


def attention_reference(q, k, v, rows, causal):
    """float64 attention of query rows `rows` (BSHD, GQA by head groups, bottom-right causal)."""
    import torch

    qs = q[:, rows].double()
    group = q.shape[2] // k.shape[2]
    kd = k.double().repeat_interleave(group, dim=2)
    vd = v.double().repeat_interleave(group, dim=2)
    scale = q.shape[-1] ** -0.5
    s = torch.einsum("brhd,bshd->bhrs", qs, kd) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        pos = torch.as_tensor(rows, device=q.device)[:, None] + (sk - sq)
        keys = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill((keys > pos)[None, None], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("bhrs,bshd->brhd", p, vd)


def sample_rows(n, most=256):
    if n <= most:
        return list(range(n))
    step = (n - 1) / (most - 1)
    return sorted({round(i * step) for i in range(most)})


def sync():
    import torch

    if DEV == "cuda":
        torch.cuda.synchronize()


def timed(fn, reps=5):
    """Median ms of `reps` calls after one warm-up, timed with CUDA events."""
    import torch

    fn()
    if DEV != "cuda":
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        times.sort()
        return round(times[len(times) // 2], 4)
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return round(times[len(times) // 2], 4)


def policy_handle(lz, tmp, name, doc):
    path = Path(tmp) / f"{name}.json"
    path.write_text(json.dumps(doc))
    return lz.LayerZero.host().with_policy(str(path))


def reasons_of(e):
    return [{"code": r.code.name, "message": str(r)} for r in getattr(e, "reasons", [])][:12]


# 0. The machine and the software on it.


def environment():
    import torch

    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
    for mod in ("transformers", "triton", "liger_kernel", "flash_attn", "flashinfer", "xformers"):
        try:
            from importlib.metadata import version

            __import__(mod)
            info[mod] = version(mod.replace("_", "-")) if mod != "liger_kernel" else version("liger-kernel")
        except Exception as e:  # noqa: BLE001 - absent is a finding
            info[mod] = f"not importable: {type(e).__name__}: {str(e)[:160]}"
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        info["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except Exception as e:  # noqa: BLE001
        info["nvidia_smi"] = f"{type(e).__name__}: {e}"
    import layerzero as lz

    info["layerzero"] = lz.__version__
    return info


# 1. Detection from the driver.


def detection(lz_bin):
    import torch

    import layerzero as lz

    cli = subprocess.run([lz_bin, "doctor", "--json"], capture_output=True, text=True, timeout=300)
    doctor = json.loads(cli.stdout)
    py = lz.doctor()
    gpu = next((d for d in doctor["hardware"]["devices"] if d["kind"] == "cuda"), None)
    if gpu is None:
        raise RuntimeError(f"lz doctor found no CUDA device: {doctor['hardware_notes']}")
    h100 = json.loads((ROOT / "capabilities/hardware/h100.json").read_text())["devices"][0]
    props = torch.cuda.get_device_properties(0)
    torch_view = {
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "compute_units": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "l2_bytes": getattr(props, "L2_cache_size", None),
    }
    fields = ["name", "compute_capability", "compute_units", "memory_bytes", "memory_bandwidth_gbps", "l2_bytes", "driver", "runtime"]
    rows = []
    for f in fields:
        rows.append({"field": f, "detected": gpu.get(f), "h100_profile": h100.get(f), "torch": torch_view.get(f)})
    for dt in sorted(set(gpu.get("peak_tflops", {})) | set(h100.get("peak_tflops", {}))):
        rows.append(
            {
                "field": f"peak_tflops.{dt}",
                "detected": gpu.get("peak_tflops", {}).get(dt),
                "h100_profile": h100.get("peak_tflops", {}).get(dt),
                "torch": None,
            }
        )
    free, total = torch.cuda.mem_get_info(0)
    return {
        "fields": rows,
        "fingerprint_cli": doctor["hardware"]["fingerprint"],
        "fingerprint_python": py["hardware"]["fingerprint"],
        "device_memory_cli": doctor.get("device_memory"),
        "device_memory_python": py.get("device_memory"),
        "torch_mem_get_info": {"free_bytes": free, "total_bytes": total},
        "hardware_notes": doctor["hardware_notes"],
        "sample_selection": doctor["sample_selection"],
        "doctor_ok": doctor["ok"],
        "python_backends": py.get("python_backends"),
    }


# 2. The seed's GPU kernels through LayerZero.


def selftest():
    import layerzero as lz

    results = lz.selftest()
    return {k: v for k, v in results.items() if v.get("ok") is not None or "cuda" in str(v.get("error"))}


def attention_matrix(tmp, seqs, reps):
    import torch

    import layerzero as lz

    handles = {k: policy_handle(lz, tmp, k, {"rules": [{"action": "lock", "kernels": k}]}) for k in SDPA}
    default = lz.LayerZero.host()
    rows = []
    g = torch.Generator(device=DEV).manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        dname = str(dtype).removeprefix("torch.")
        for seq in seqs:
            for mode in ("prefill", "decode"):
                sq = seq if mode == "prefill" else 1
                try:
                    q = torch.randn(1, sq, 32, 128, device=DEV, dtype=dtype, generator=g)
                    k = torch.randn(1, seq, 8, 128, device=DEV, dtype=dtype, generator=g)
                    v = torch.randn(1, seq, 8, 128, device=DEV, dtype=dtype, generator=g)
                    picks = sample_rows(sq)
                    want = attention_reference(q, k, v, picks, True)
                except torch.OutOfMemoryError as e:
                    rows.append({"dtype": dname, "seq": seq, "mode": mode, "kernel": "-", "error": f"inputs: {e}"[:300]})
                    continue
                for kernel, h in [("default", default)] + list(handles.items()):
                    row = {"dtype": dname, "seq": seq, "mode": mode, "kernel": kernel}
                    try:
                        row["selected"] = h.which("attention", q=q, k=k, v=v, causal=True)
                        before = h.counters()["fallbacks"]
                        got = lz.ops.attention(q, k, v, causal=True, handle=h)
                        sync()
                        row.update(close(got[:, picks].double(), want, "attention", dname))
                        row["fell_back"] = h.counters()["fallbacks"] - before
                        row["ms"] = timed(lambda: lz.ops.attention(q, k, v, causal=True, handle=h), reps)
                        del got
                    except Exception as e:  # noqa: BLE001 - a refusal or failure is a result
                        row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
                        row["reasons"] = reasons_of(e)
                        if isinstance(e, torch.OutOfMemoryError):
                            torch.cuda.empty_cache()
                    rows.append(row)
                    print(json.dumps(row)[:300], flush=True)
                del q, k, v, want
                torch.cuda.empty_cache()
    return rows


def paged():
    """§6.2 on the GPU: the request and every candidate's verdict (what runs it)."""
    import torch

    import layerzero as lz

    q = torch.randn(2, 1, 32, 128, device=DEV, dtype=torch.bfloat16)
    cache = torch.randn(64, 16, 8, 128, device=DEV, dtype=torch.bfloat16)
    table = torch.arange(64, device=DEV, dtype=torch.int32).reshape(2, 32)
    lens = torch.tensor([300, 511], device=DEV, dtype=torch.int32)
    out = {}
    try:
        lz.ops.paged_attention(q, cache, cache, table, lens)
        out["ran"] = True
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    report = lz.explain(
        "paged_attention",
        q=q,
        k_cache=cache,
        v_cache=cache,
        block_table=table,
        context_lens=lens,
        layouts={"k_cache": "NHD", "v_cache": "NHD"},
    )
    out["candidates"] = [
        {"kernel": c.kernel, "verdict": c.verdict, "codes": sorted({r.code.name for r in c.reasons})}
        for c in report.candidates
        if "cuda" in c.kernel or c.kernel.split(".")[0] in ("flash_attn_2", "flash_attn_3", "flashinfer")
    ]
    return out


def non_attention(reps):
    """§6.15 on the GPU: Liger's RMSNorm, SwiGLU and RoPE through layerzero.ops against
    float64; the ops no GPU kernel serves, with their reasons."""
    import torch
    import torch.nn.functional as F

    import layerzero as lz

    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        dname = str(dtype).removeprefix("torch.")
        for tokens in (1, 512, 4096):
            x = torch.randn(tokens, 4096, device=DEV, dtype=dtype)
            w = (1 + 0.1 * torch.randn(4096, device=DEV)).to(dtype)
            xd, wd = x.double(), w.double()
            cases = [
                (
                    "rms_norm",
                    "norms",
                    lambda: lz.ops.rms_norm(x, w, eps=1e-5),
                    lambda: xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * wd,
                    lambda: lz.which("rms_norm", x=x, weight=w, eps=1e-5),
                ),
            ]
            gate = torch.randn(tokens, 14336, device=DEV, dtype=dtype)
            up = torch.randn(tokens, 14336, device=DEV, dtype=dtype)
            cases.append(
                (
                    "swiglu",
                    "gemm",
                    lambda: lz.ops.swiglu(gate, up),
                    lambda: F.silu(gate.double()) * up.double(),
                    lambda: lz.which("swiglu", gate=gate, up=up),
                )
            )
            qr = torch.randn(1, tokens, 32, 128, device=DEV, dtype=dtype)

            def rope_ref():
                d = 128
                inv = 10000.0 ** (-torch.arange(0, d, 2, device=DEV, dtype=torch.float64) / d)
                ang = torch.arange(tokens, device=DEV, dtype=torch.float64)[:, None] * inv
                cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :]
                sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :]
                qd = qr.double()
                return qd * cos + torch.cat([-qd[..., d // 2 :], qd[..., : d // 2]], -1) * sin

            cases.append(
                (
                    "rope",
                    "rope",
                    lambda: lz.ops.rope(qr, base=10000.0),
                    rope_ref,
                    lambda: lz.which("rope", q=qr, base=10000.0),
                )
            )
            for op, category, run, ref, which in cases:
                row = {"op": op, "dtype": dname, "tokens": tokens}
                try:
                    row["selected"] = which()
                    got = run()
                    sync()
                    row.update(close(got.double(), ref(), category, dname))
                    row["ms"] = timed(run, reps)
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
                    row["reasons"] = reasons_of(e)
                rows.append(row)
                print(json.dumps(row)[:300], flush=True)
    refused = {}
    x = torch.randn(4, 4096, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(1024, 4096, device=DEV, dtype=torch.bfloat16)
    for op, call in [
        ("linear", lambda: lz.ops.linear(x, w)),
        ("layer_norm", lambda: lz.ops.layer_norm(x, torch.ones(4096, device=DEV, dtype=torch.bfloat16))),
        ("embedding", lambda: lz.ops.embedding(torch.tensor([1, 2], device=DEV), w)),
    ]:
        try:
            call()
            refused[op] = "ran"
        except Exception as e:  # noqa: BLE001
            refused[op] = {"error": f"{type(e).__name__}: {str(e)[:300]}", "codes": sorted({r["code"] for r in reasons_of(e)})}
    return {"rows": rows, "ops_without_a_gpu_kernel": refused}


def fault_drill():
    """LAYERZERO_FAULTS on the GPU kernel the host selects: the call falls back, the output
    stays right; under a lock, the failure is the error with its reason code."""
    import torch

    import layerzero as lz

    q = torch.randn(1, 512, 32, 128, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(1, 512, 8, 128, device=DEV, dtype=torch.bfloat16)
    want = attention_reference(q, k, k, list(range(512)), True)
    first = lz.which("attention", q=q, k=k, v=k, causal=True)
    os.environ["LAYERZERO_FAULTS"] = f"{first}=error"
    try:
        drilled = lz.LayerZero.host()
        got = lz.ops.attention(q, k, k, causal=True, handle=drilled)
        out = {"faulted": first, "fallbacks": drilled.counters()["fallbacks"]}
        # Explain does not see injected faults: the ranking the fallback walks.
        out["ranking"] = [
            c.kernel
            for c in drilled.explain("attention", q=q, k=k, v=k, causal=True).candidates
            if c.verdict in ("selected", "eligible")
        ]
        out.update(close(got.double(), want, "attention", "bfloat16"))
        lock = Path(os.environ.get("TMPDIR", "/tmp")) / "lz-drill-lock.json"
        lock.write_text(json.dumps({"rules": [{"action": "lock", "kernels": first}]}))
        try:
            lz.ops.attention(q, k, k, causal=True, handle=lz.LayerZero.host().with_policy(str(lock)))
            out["locked"] = "ran (the fault was not injected)"
        except Exception as e:  # noqa: BLE001
            out["locked"] = {"error": f"{type(e).__name__}: {str(e)[:300]}", "codes": [r["code"] for r in reasons_of(e)]}
    finally:
        del os.environ["LAYERZERO_FAULTS"]
    return out


# 3. The cost model against measured times.


def cost_model(tmp, budget):
    import layerzero as lz

    perfdb = Path(tmp) / "perfdb.sqlite"
    calibration = Path(tmp) / "calibration-h100.json"
    report = lz.tune(
        str(ROOT / "workloads/gpu-check-h100.json"),
        perfdb=str(perfdb),
        budget=budget,
        verify=True,
        calibrate=str(calibration),
        hardware="h100",
    )
    (Path(OUTDIR) / "tune.json").write_text(json.dumps(report, indent=1))
    verify = report.get("verify") or {}
    buckets = []
    for b in verify.get("buckets", []):
        buckets.append(
            {
                "entry": b["entry"],
                "bucket": b["bucket"],
                "fastest": b["fastest"],
                "fastest_us": round(b["fastest_ns"] / 1e3, 2),
                "model_pick": b["model"]["kernel"],
                "model_regret": round(b["model"]["regret"], 4),
                "perfdb_pick": b["perfdb"]["kernel"],
                "perfdb_regret": round(b["perfdb"]["regret"], 4),
                "calibrated_pick": (b.get("calibrated") or {}).get("kernel"),
                "calibrated_regret": (b.get("calibrated") or {}).get("regret"),
                "times_us": {t["kernel"]: (round(t["median_ns"] / 1e3, 2) if t["median_ns"] else t["error"]) for t in b["times"]},
            }
        )
    cal = json.loads(calibration.read_text()) if calibration.exists() else None
    return {
        "summary": {k: verify.get(k) for k in ("verified", "unverified", "model", "perfdb", "calibrated", "contested", "wins_by_backend")},
        "buckets": buckets,
        "calibration": cal,
        "failures": [r for r in report.get("results", []) if r.get("status") == "failed"][:20],
        "skipped": len(report.get("skipped", [])),
        "unselectable": report.get("unselectable", [])[:20],
        "elapsed_s": report.get("elapsed_s"),
        "budget_exhausted": report.get("budget_exhausted"),
    }


# 4. CUDA graphs.


def graphs():
    import torch

    import layerzero as lz
    import layerzero.torch_ops  # noqa: F401 - registers torch.ops.layerzero

    ops = torch.ops.layerzero
    torch.manual_seed(0)
    dt, hidden, heads, kv, d, cache = torch.bfloat16, 1024, 8, 2, 128, 256
    w = {
        "qkv": torch.randn(hidden, (heads + 2 * kv) * d, device=DEV, dtype=dt) * 0.02,
        "o": torch.randn(heads * d, hidden, device=DEV, dtype=dt) * 0.02,
        "gate": torch.randn(hidden, 2816, device=DEV, dtype=dt) * 0.02,
        "up": torch.randn(hidden, 2816, device=DEV, dtype=dt) * 0.02,
        "down": torch.randn(2816, hidden, device=DEV, dtype=dt) * 0.02,
        "n1": torch.ones(hidden, device=DEV, dtype=dt),
        "n2": torch.ones(hidden, device=DEV, dtype=dt),
    }
    k_cache = torch.randn(1, cache, kv, d, device=DEV, dtype=dt)
    v_cache = torch.randn(1, cache, kv, d, device=DEV, dtype=dt)
    x = torch.randn(1, 1, hidden, device=DEV, dtype=dt)

    def step(x):
        # Projections are torch matmuls (no GPU linear kernel is declared); the rest runs
        # through LayerZero's custom ops.
        h = ops.rms_norm(x, w["n1"], 1e-6)
        q, k, v = (h @ w["qkv"]).split([heads * d, kv * d, kv * d], dim=-1)
        q = q.reshape(1, 1, heads, d).contiguous()
        k = k.reshape(1, 1, kv, d).contiguous()
        q, k = ops.rope_qk(q, k, base=10000.0)
        keys = torch.cat([k_cache[:, 1:], k], dim=1)
        vals = torch.cat([v_cache[:, 1:], v.view(1, 1, kv, d)], dim=1)
        a = ops.attention(q, keys, vals, causal=True)
        x = x + a.reshape(1, 1, heads * d) @ w["o"]
        h = ops.rms_norm(x, w["n2"], 1e-6)
        return x + ops.swiglu(h @ w["gate"], h @ w["up"]) @ w["down"]

    out = {}
    with lz.graph_safe() as strict:
        eager = step(x)
        sync()
        out["kernels"] = {
            "rms_norm": strict.which("rms_norm", x=x, weight=w["n1"], eps=1e-6),
            "attention": strict.which("attention", q=torch.empty(1, 1, heads, d, device=DEV, dtype=dt), k=k_cache, v=v_cache, causal=True),
        }
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                step(x)  # warm on the capture stream, as torch's docs ask
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            captured = step(x)
        for _ in range(3):
            graph.replay()
        sync()
    out["replay_equals_eager"] = bool(torch.equal(captured, eager))
    out["replay_max_abs_diff"] = float((captured.double() - eager.double()).abs().max().item())
    # A new input, copied into the captured one, replays to that input's eager result.
    x.copy_(torch.randn_like(x))
    graph.replay()
    sync()
    with lz.graph_safe():
        fresh = step(x)
    out["replay_with_new_input_max_abs_diff"] = float((captured.double() - fresh.double()).abs().max().item())
    out["replay_ms"] = timed(graph.replay, 20)
    with lz.graph_safe():
        out["eager_ms"] = timed(lambda: step(x), 20)

    # Graph-strict selection: every kernel admitted is graph-safe; the rest say why.
    q = torch.randn(1, 512, 32, 128, device=DEV, dtype=dt)
    k = torch.randn(1, 512, 8, 128, device=DEV, dtype=dt)
    planning = lz.LayerZero.planning("h100")
    strict_h100 = lz._lz.graph_strict(planning)
    verdicts = {}
    for c in strict_h100.explain("attention", q=q, k=k, v=k, causal=True).candidates:
        if c.kernel.startswith(("torch_sdpa", "flash", "xformers")) and not c.kernel.endswith(("_cpu", "_rocm", "_ck", "_amd")):
            verdicts[c.kernel] = {"verdict": c.verdict, "codes": sorted({r.code.name for r in c.reasons})}
    out["graph_strict_on_h100"] = verdicts
    # The no-graph-safe-kernel error: cuDNN attention (not graph-safe) as the only kernel.
    path = Path(os.environ.get("TMPDIR", "/tmp")) / "lz-cudnn-only.json"
    path.write_text(json.dumps({"rules": [{"action": "allow", "kernels": "torch_sdpa.attention.cudnn"}]}))
    cudnn_only = lz.LayerZero.host().with_policy(str(path))
    try:
        with lz.graph_safe(cudnn_only) as h:
            lz.ops.attention(q, k, k, causal=True, handle=h)
        out["no_graph_safe_kernel"] = "ran (expected a refusal)"
    except Exception as e:  # noqa: BLE001
        out["no_graph_safe_kernel"] = {"error": f"{type(e).__name__}: {str(e)[:500]}", "codes": sorted({r["code"] for r in reasons_of(e)})}
    return out


# 5. Models through HF transformers.


def models(new_tokens, rounds):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    import layerzero.transformers  # noqa: F401 - registers attn_implementation="layerzero"

    out = {}
    tiny = ROOT / "tests/models/llama-gqa-bf16"
    if not tiny.exists():
        tiny = ROOT / "tests/models/llama-gqa"
    big_config = LlamaConfig(
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        vocab_size=32000,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        dtype="bfloat16",
    )

    def load(which, impl):
        if which == "tiny":
            return AutoModelForCausalLM.from_pretrained(tiny, attn_implementation=impl, dtype=torch.bfloat16).to(DEV).eval()
        torch.manual_seed(125)
        m = LlamaForCausalLM._from_config(big_config, attn_implementation=impl, dtype=torch.bfloat16)
        return m.to(DEV).eval()

    for which in ("tiny", "llama-125m"):
        ours, theirs = load(which, "layerzero"), load(which, "sdpa")
        if which != "tiny":
            theirs.load_state_dict(ours.state_dict())
        vocab = ours.config.vocab_size
        g = torch.Generator(device="cpu").manual_seed(3)
        prompt = torch.randint(0, vocab, (1, 64), generator=g).to(DEV)
        with torch.no_grad():
            lo = ours(prompt).logits.double()
            lt = theirs(prompt).logits.double()
        entry = {
            "params_m": round(sum(p.numel() for p in ours.parameters()) / 1e6, 1),
            "logits_max_abs_diff": float((lo - lt).abs().max().item()),
            "logits_scale": float(lt.abs().max().item()),
            "argmax_agreement": float((lo.argmax(-1) == lt.argmax(-1)).double().mean().item()),
        }
        kw = dict(max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens)
        with torch.no_grad():
            a = ours.generate(prompt, **kw)
            b = theirs.generate(prompt, **kw)
        entry["greedy_tokens_identical"] = bool(torch.equal(a, b))
        entry["first_divergence"] = None if torch.equal(a, b) else int((a != b).nonzero()[0, 1].item())
        speeds = {"layerzero": [], "sdpa": []}
        for _ in range(rounds):  # interleaved, same prompt, same length
            for name, m in (("layerzero", ours), ("sdpa", theirs)):
                sync()
                t = time.perf_counter()
                with torch.no_grad():
                    m.generate(prompt, **kw)
                sync()
                speeds[name].append(new_tokens / (time.perf_counter() - t))
        for name, s in speeds.items():
            s.sort()
            entry[f"tokens_per_s_{name}"] = round(s[len(s) // 2], 1)
        entry["speed_ratio_layerzero_over_sdpa"] = round(entry["tokens_per_s_layerzero"] / entry["tokens_per_s_sdpa"], 3)
        out[which] = entry
        print(which, json.dumps(entry), flush=True)
        del ours, theirs
        torch.cuda.empty_cache()
    return out


def markdown(data):
    lines = [f"# LayerZero GPU check ({data['started']})", ""]
    for name, step in data["steps"].items():
        lines.append(f"## {name}: {'ok' if step['ok'] else 'FAILED'} ({step['seconds']} s)")
        if not step["ok"]:
            lines += ["", "```", step["error"], "```", ""]
            continue
        r = step["result"]
        if name == "detection":
            lines += ["", "| field | detected | h100 profile | torch |", "|---|---|---|---|"]
            for row in r["fields"]:
                lines.append(f"| {row['field']} | {row['detected']} | {row['h100_profile']} | {row['torch']} |")
            lines += ["", f"free memory: driver {r['device_memory_python']}; torch {r['torch_mem_get_info']}", ""]
        elif name == "attention":
            lines += ["", "| dtype | seq | mode | kernel | selected | ok | max abs err | worst/tol | ms | error |", "|---|---|---|---|---|---|---|---|---|---|"]
            for row in r:
                lines.append(
                    f"| {row['dtype']} | {row['seq']} | {row['mode']} | {row['kernel']} | {row.get('selected', '-')} | "
                    f"{row.get('ok', '-')} | {row.get('max_abs_err', '-')} | {row.get('worst_ratio', '-')} | "
                    f"{row.get('ms', '-')} | {row.get('error', '')[:120]} |"
                )
            lines.append("")
        elif name == "cost_model":
            lines += ["", "| entry | bucket | fastest | us | model (h100) pick | regret | calibrated pick | regret |", "|---|---|---|---|---|---|---|---|"]
            for b in r["buckets"]:
                lines.append(
                    f"| {b['entry']} | {b['bucket']} | {b['fastest']} | {b['fastest_us']} | {b['model_pick']} | "
                    f"{b['model_regret']} | {b['calibrated_pick']} | {b['calibrated_regret']} |"
                )
            lines += ["", "```", json.dumps(r["summary"], indent=1), "```", ""]
        else:
            lines += ["", "```", json.dumps(r, indent=1, default=str)[:6000], "```", ""]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--lz", default=str(ROOT / "target/release/lz"))
    ap.add_argument("--seqs", default="128,512,2048,8192,32768")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tune-budget", type=float, default=90.0)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated steps to run (default: all)")
    ap.add_argument("--dry-run-cpu", action="store_true", help="run the steps' logic on CPU tensors (no GPU)")
    a = ap.parse_args()
    global DEV, OUTDIR
    OUTDIR = a.out
    if a.dry_run_cpu:
        DEV = "cpu"
    import tempfile

    tmp = tempfile.mkdtemp(prefix="lz-gpu-check-")
    os.environ.setdefault("LAYERZERO_HOME", str(Path(tmp) / "home"))
    report = Report(a.out)
    seqs = [int(s) for s in a.seqs.split(",") if s]
    steps = [
        ("environment", environment),
        ("detection", detection, a.lz),
        ("selftest", selftest),
        ("attention", attention_matrix, tmp, seqs, a.reps),
        ("paged_attention", paged),
        ("non_attention", non_attention, a.reps),
        ("fault_drill", fault_drill),
        ("cuda_graphs", graphs),
        ("cost_model", cost_model, tmp, a.tune_budget),
        ("models", models, a.new_tokens, a.rounds),
    ]
    only = {s for s in a.only.split(",") if s}
    import torch

    if not torch.cuda.is_available() and not a.dry_run_cpu:
        steps = steps[:1]
        report.data["note"] = "no CUDA device: only the environment step ran"
    for name, fn, *args in steps:
        if only and name not in only:
            continue
        report.step(name, fn, *args)
    report.data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report.save()
    print(f"report: {a.out}/report.md", flush=True)


if __name__ == "__main__":
    main()
