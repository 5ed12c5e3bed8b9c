#!/usr/bin/env python3
"""Hugging Face ``generate`` with ``attn_implementation="layerzero"`` against ``"sdpa"`` (and
``"eager"``) on this CPU, same run, interleaved rounds.

The model is a ~125M-parameter Llama (hidden 768, 12 layers, 12 heads, 4 KV heads,
intermediate 2048, vocab 32000, the shape of tools/bench_generate.py) with random weights from
one seed, loaded once per attention implementation (the same weights). Each round runs every
implementation once, in an order that rotates, on the same prompt: a greedy ``generate`` of
``--new`` tokens after a ``--prompt``-token prompt. Prints the median tokens/s of the whole
call (prefill and decode) and of the decode steps alone (timed by a streamer), per
implementation, and layerzero / sdpa ratios; and checks the tokens are identical.

    python tools/bench_python_generate.py [--rounds 7] [--prompt 128] [--new 32] [--dtype float32]
"""

import argparse
import statistics
import time


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--impls", default="layerzero,sdpa,eager")
    a = ap.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import layerzero as lz
    import layerzero.transformers  # noqa: F401 - registers attn_implementation="layerzero"

    dtype = getattr(torch, a.dtype)
    cfg = dict(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        intermediate_size=2048,
        vocab_size=32000,
        max_position_embeddings=4096,
    )
    impls = a.impls.split(",")
    models = {}
    for impl in impls:
        torch.manual_seed(0)
        m = LlamaForCausalLM(LlamaConfig(**cfg, attn_implementation=impl)).to(dtype).eval()
        models[impl] = m
    ids = torch.randint(0, cfg["vocab_size"], (1, a.prompt), generator=torch.Generator().manual_seed(1))
    print(f"cpu: {cpu_model()}; torch {torch.__version__} threads {torch.get_num_threads()}; layerzero {lz.__version__}")
    print(f"~125M Llama {a.dtype}, prompt {a.prompt}, {a.new} new tokens, greedy, {a.rounds} rounds")

    class Stamps:
        """A streamer that stamps each new token (the first put is the prompt)."""

        def __init__(self):
            self.t = []

        def put(self, value):
            self.t.append(time.perf_counter())

        def end(self):
            pass

    def run(impl):
        s = Stamps()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = models[impl].generate(
                ids, max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False, streamer=s, pad_token_id=0
            )
        total = time.perf_counter() - t0
        decode = s.t[-1] - s.t[1] if len(s.t) > 2 else float("nan")
        return out, a.new / total, (len(s.t) - 2) / decode

    tokens = {impl: run(impl)[0] for impl in impls}  # warm-up, and the tokens to compare
    for impl in impls[1:]:
        same = torch.equal(tokens[impl], tokens[impls[0]])
        print(f"tokens {impls[0]} == {impl}: {same}")
    whole = {i: [] for i in impls}
    dec = {i: [] for i in impls}
    for r in range(a.rounds):
        order = impls[r % len(impls):] + impls[: r % len(impls)]
        for impl in order:
            _, w, d = run(impl)
            whole[impl].append(w)
            dec[impl].append(d)
    print(f"\n{'impl':<10} {'generate tok/s':>15} {'decode tok/s':>13}")
    for impl in impls:
        print(f"{impl:<10} {statistics.median(whole[impl]):15.1f} {statistics.median(dec[impl]):13.1f}")
    if "layerzero" in impls and "sdpa" in impls:
        rw = statistics.median(whole["layerzero"]) / statistics.median(whole["sdpa"])
        rd = statistics.median(dec["layerzero"]) / statistics.median(dec["sdpa"])
        print(f"\nlayerzero / sdpa: generate {rw:.3f}, decode {rd:.3f}")
    print(f"lz.counters(): {lz.counters()}")


if __name__ == "__main__":
    main()
