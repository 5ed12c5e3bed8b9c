"""Greedy generation with a Hugging Face causal LM whose attention runs through LayerZero.

    python examples/python/hf_generate.py                       # tests/models/llama-gqa
    python examples/python/hf_generate.py tests/models/qwen3 --prompt-ids 1,17,42,99
    python examples/python/hf_generate.py tests/models/llama-gqa --prompt "the kernel" --patch

`import layerzero.transformers` registers attn_implementation="layerzero"; every attention call
of the model then goes through `layerzero.ops.attention`, which picks the kernel per call.
`--patch` also routes the RMSNorms and gated MLPs through LayerZero (opt-in).
"""

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import layerzero as lz
import layerzero.transformers as lzt

ROOT = Path(__file__).resolve().parents[2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=str(ROOT / "tests" / "models" / "llama-gqa"), help="model folder")
    ap.add_argument("--prompt", default="the kernel selector picks", help="text (needs a tokenizer in the folder)")
    ap.add_argument("--prompt-ids", default=None, help="comma-separated token ids instead of --prompt")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--patch", action="store_true", help="also route RMSNorm and MLP modules through LayerZero")
    args = ap.parse_args()

    model = AutoModelForCausalLM.from_pretrained(
        args.model, attn_implementation="layerzero", dtype=getattr(torch, args.dtype)
    ).eval()
    if args.patch:
        print("patched:", lzt.patch_modules(model))

    tokenizer = None
    if args.prompt_ids is not None:
        ids = torch.tensor([[int(t) for t in args.prompt_ids.split(",")]])
    else:
        if not any((Path(args.model) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
            raise SystemExit(f"{args.model} has no tokenizer; pass --prompt-ids (e.g. --prompt-ids 1,17,42,99)")
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        ids = tokenizer(args.prompt, return_tensors="pt").input_ids
        if ids.numel() == 0:
            raise SystemExit("the prompt encodes to no tokens; pass --prompt-ids")

    def generate(max_new_tokens):
        with torch.no_grad():
            return model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=model.generation_config.eos_token_id,
            )

    before = lz.counters()
    out = generate(args.max_new_tokens)
    after = lz.counters()

    print("prompt ids:   ", ids[0].tolist())
    print("generated ids:", out[0, ids.shape[1] :].tolist())
    if tokenizer is not None:
        print("text:         ", repr(tokenizer.decode(out[0], skip_special_tokens=True)))
    print("lz.counters() of this generate:", {k: after[k] - before[k] for k in after if after[k] != before[k]})
    print("lz.counters():", after)

    # Which kernel each attention call gets (a traced rerun of prefill + one decode step: the
    # trace asks lz.which for every call, which would also count in the counters above).
    with lzt.trace() as calls:
        generate(2)
    for c in calls:
        step = "prefill" if c["q"][2] > 1 else "decode "
        print(f"  layer {c['layer']} {step} q{list(c['q'])} k{list(c['k'])} mask={c['mask']} -> {c['kernel']}")


if __name__ == "__main__":
    main()
