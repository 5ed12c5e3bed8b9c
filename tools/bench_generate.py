#!/usr/bin/env python3
"""Generation speed: `lz generate` against HF transformers (and llama.cpp when installed),
same model, same prompt, same threads, in interleaved rounds; prints prefill and decode
tokens/s per engine and our ratio to each (medians).

    tools/.venv/bin/python tools/bench_generate.py [--threads 2] [--prompt 512] [--new 128]
        [--rounds 3] [--dtype f32 bf16] [--lz target/release/lz] [--dir /tmp/lz-bench-125m]

The model is a ~125M-parameter Llama (hidden 768, 12 layers, 12 heads, 4 KV heads,
intermediate 2048, vocab 32000) with random weights, written once to --dir in f32 and bf16.
Only speed is compared, so random weights are fine. Build ours first:
`cargo build --release -p layerzero --bin lz`. llama.cpp is measured when the
`llama_cpp` (llama-cpp-python) and `gguf` packages are importable; otherwise it is reported as
not installed. With `--tune SECONDS`, `lz workload` and `lz tune` first measure the model's own
ops into a PerfDB under --dir (LAYERZERO_HOME), so selection is measured rather than modeled.
"""

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def make_model(root: Path) -> None:
    if (root / "f32" / "config.json").exists() and (root / "bf16" / "config.json").exists():
        return
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        intermediate_size=2048,
        vocab_size=32000,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(root / "f32", safe_serialization=True)
    model.to(torch.bfloat16).save_pretrained(root / "bf16", safe_serialization=True)


def tune(lz: str, model: Path, home: Path, threads: int, budget: int, max_seq: int) -> None:
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), LAYERZERO_HOME=str(home))
    workload = home / f"{model.name}.workload.json"
    subprocess.run([lz, "workload", "--model", str(model), "--max-batch", "1", "--max-seq", str(max_seq),
                    "--out", str(workload)], env=env, check=True, capture_output=True)
    subprocess.run([lz, "tune", "--workload", str(workload), "--budget", str(budget)], env=env, check=True,
                   capture_output=True)


def ours(lz: str, model: Path, prompt: list, new: int, threads: int, home: Path) -> tuple:
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), LAYERZERO_HOME=str(home))
    out = subprocess.run(
        [lz, "generate", "--model", str(model), "--prompt-ids", ",".join(map(str, prompt)),
         "--max-new-tokens", str(new), "--ignore-eos", "--json"],
        env=env, check=True, capture_output=True, text=True,
    )
    t = json.loads(out.stdout)["timing"]
    return t["prefill_tokens_per_s"], t["decode_tokens_per_s"]


class Hf:
    def __init__(self, model: Path, dtype: torch.dtype):
        self.model = LlamaForCausalLM.from_pretrained(model, dtype=dtype).eval()

    @torch.inference_mode()
    def run(self, prompt: list, new: int) -> tuple:
        ids = torch.tensor([prompt])
        start = time.perf_counter()
        out = self.model(ids, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        prefill = time.perf_counter() - start
        # transformers 5 names the cache `cache` (older releases `past_key_values`).
        new_api = hasattr(out, "cache")
        cache = out.cache if new_api else out.past_key_values
        start = time.perf_counter()
        for _ in range(new - 1):
            if new_api:
                out = self.model(token, cache=cache, use_cache=True)
                cache = out.cache
            else:
                out = self.model(token, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
            token = out.logits[:, -1].argmax(-1, keepdim=True)
        decode = time.perf_counter() - start
        return len(prompt) / prefill, (new - 1) / decode


def llama_cpp_available() -> bool:
    try:
        import gguf  # noqa: F401
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", nargs="+", default=["f32", "bf16"])
    ap.add_argument("--lz", default="target/release/lz")
    ap.add_argument("--dir", default="/tmp/lz-bench-125m")
    ap.add_argument("--tune", type=int, default=0, metavar="SECONDS",
                    help="measure the model's ops into a PerfDB first (lz workload + lz tune)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    root = Path(a.dir)
    make_model(root)
    prompt = [(i * 7919 + 13) % 32000 for i in range(a.prompt)]
    print(f"threads {a.threads}, prompt {a.prompt}, new {a.new}, rounds {a.rounds}; "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs")
    if not llama_cpp_available():
        print("llama.cpp: not installed (pip install llama-cpp-python gguf to include it)")
    home = root / ("home-tuned" if a.tune else "home-model-only")
    home.mkdir(parents=True, exist_ok=True)
    print(f"selection: {'PerfDB-backed (tuned ' + str(a.tune) + ' s per dtype)' if a.tune else 'cost model only'}")
    rows = []
    for dt in a.dtype:
        if a.tune:
            tune(a.lz, root / dt, home, a.threads, a.tune, a.prompt + a.new)
        hf = Hf(root / dt, torch.float32 if dt == "f32" else torch.bfloat16)
        samples = {"ours": [], "hf": []}
        for _ in range(a.rounds):
            samples["ours"].append(ours(a.lz, root / dt, prompt, a.new, a.threads, home))
            samples["hf"].append(hf.run(prompt, a.new))
        med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in samples.items()}
        rows.append((dt, med))
    print(f"{'dtype':<6} {'engine':<8} {'prefill tok/s':>14} {'decode tok/s':>13}")
    for dt, med in rows:
        for k, (p, d) in med.items():
            print(f"{dt:<6} {k:<8} {p:>14.1f} {d:>13.1f}")
        (op, od), (hp, hd) = med["ours"], med["hf"]
        print(f"{dt:<6} {'ours/hf':<8} {op / hp:>14.2f} {od / hd:>13.2f}")


if __name__ == "__main__":
    main()
