#!/usr/bin/env python3
"""Speculative decoding speed: `lz generate --draft` against the target alone, timed in the
same process by `lz` itself (`speculative.ms` and `speculative.target_only_ms` of its
report), over draft lengths K, in rounds; prints medians of acceptance and speed-up.

    tools/.venv/bin/python tools/bench_speculative.py [--threads 2] [--new 64] [--rounds 3]
        [--k 2 4 6] [--lz target/release/lz] [--dir /tmp/lz-bench-spec]

No hub access here, so the pairs are built from random weights (written once to --dir):

* target: a Llama of hidden 768, 12 layers, 12 heads (4 KV), intermediate 2048, vocab 32000
  (the model of bench_generate.py), f32;
* `near` draft: the target's first 2 layers with its embeddings, final norm and head, while
  the target's layers 2..11 write their attention and MLP outputs scaled by --damp (their
  o_proj and down_proj weights multiplied by it): a cheap draft (2 of 12 layers) that agrees
  with its target often, as a distilled draft does with a real one;
* `foreign` draft: another random 2-layer model of the same vocabulary, which almost never
  agrees (the cost of speculating with a bad draft).

Greedy decoding, so every run's tokens must equal the target's alone (`matches_target_only`),
which is checked. Build ours first: `cargo build --release -p layerzero-cli --bin lz`.
"""

import argparse
import json
import os
import statistics
import subprocess
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def config(layers: int) -> LlamaConfig:
    return LlamaConfig(hidden_size=768, num_hidden_layers=layers, num_attention_heads=12, num_key_value_heads=4,
                       intermediate_size=2048, vocab_size=32000, max_position_embeddings=2048,
                       tie_word_embeddings=False)


def make_models(root: Path, damp: float) -> None:
    if all((root / n / "config.json").exists() for n in ("target", "near", "foreign")):
        return
    torch.manual_seed(0)
    target = LlamaForCausalLM(config(12)).to(torch.float32)
    with torch.no_grad():
        for layer in target.model.layers[2:]:
            layer.self_attn.o_proj.weight.mul_(damp)
            layer.mlp.down_proj.weight.mul_(damp)
    target.save_pretrained(root / "target", safe_serialization=True)
    near = LlamaForCausalLM(config(2)).to(torch.float32)
    state = {k: v for k, v in target.state_dict().items()
             if not k.startswith("model.layers.") or int(k.split(".")[2]) < 2}
    near.load_state_dict(state, strict=True)
    near.save_pretrained(root / "near", safe_serialization=True)
    torch.manual_seed(1)
    LlamaForCausalLM(config(2)).to(torch.float32).save_pretrained(root / "foreign", safe_serialization=True)


def run(lz: str, root: Path, draft: str, k: int, prompt: list, new: int, threads: int) -> dict:
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), LAYERZERO_HOME=str(root / "home"))
    out = subprocess.run([lz, "generate", "--model", str(root / "target"), "--draft", str(root / draft),
                          "--draft-tokens", str(k), "--prompt-ids", ",".join(map(str, prompt)),
                          "--max-new-tokens", str(new), "--ignore-eos", "--json"],
                         env=env, check=True, capture_output=True, text=True)
    s = json.loads(out.stdout)["speculative"]
    if s["matches_target_only"] is not True:
        raise SystemExit(f"draft {draft}, K {k}: the tokens differ from the target's alone")
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lz", default="target/release/lz")
    ap.add_argument("--dir", default="/tmp/lz-bench-spec")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, nargs="+", default=[2, 4, 6])
    ap.add_argument("--damp", type=float, default=0.005)
    args = ap.parse_args()
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    make_models(root, args.damp)
    prompt = [1] + [(37 * i + 11) % 32000 for i in range(31)]
    rows = []
    for draft in ("near", "foreign"):
        for k in args.k:
            runs = [run(args.lz, root, draft, k, prompt, args.new, args.threads) for _ in range(args.rounds)]
            med = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
            rows.append((draft, k, med("acceptance_rate"), med("tokens_per_round"), med("target_only_ms"), med("ms"),
                         med("speedup")))
    print(f"{'draft':8} {'K':>2} {'accept':>7} {'tok/round':>9} {'target ms':>10} {'spec ms':>9} {'speed-up':>8}")
    for draft, k, acc, tpr, alone, ms, sp in rows:
        print(f"{draft:8} {k:>2} {acc:>7.2f} {tpr:>9.2f} {alone:>10.1f} {ms:>9.1f} {sp:>7.2f}x")


if __name__ == "__main__":
    main()
