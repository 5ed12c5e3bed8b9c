#!/usr/bin/env python3
"""Hugging Face references for a tiny BART's encoder at long inputs (E2E 6.13: 128, 512, 2048).

Run from the repository root:

    /tmp/lz-py-venv/bin/python tools/hf_reference_seq2seq_long.py --model tests/models/bart-long \\
        [--lengths 128,512,2048] [--max-new-tokens 4] --out tests/models/bart-long/reference.safetensors

For each length L, a padded batch of two encoder inputs: row 0 has L tokens, row 1 has 3L/4
(right-padded with pad_token_id, attention_mask 0 there, as BART's tokenizer pads). Token ids are
deterministic: `<s>` (0), then ids from 3 up by a stride, then `</s>` (2). The model runs in float64
with `attn_implementation="eager"` (helpers shared with tools/hf_reference_seq2seq.py):
the encoder over the batch, then greedy decoding (argmax of the raw logits, no processors, no EOS
stop) of N tokens for both rows at once with the cache, and again without it (asserted identical).

Output (floating tensors as float32):
* `len{L}.batch.input_ids` i64 [2, L], `len{L}.batch.attention_mask` i64 [2, L];
* `len{L}.batch.enc.last` [2, L, H]: the encoder output (rows past an input's length are padding:
  computed, meaningless);
* `len{L}.batch.generated_ids` i64 [2, N]; `len{L}.batch.logits.{k}` [2, V] of cached step k;
* `len{L}.batch.greedy_margin` [2, N]: top-1 minus top-2 logit of each pick.

Checks (assertions): with and without the cache, the same tokens and logits within 1e-9; each row
of the batch equals a batch-1 run of that input alone (encoder rows, tokens, logits); an independent
float64 BART written from the checkpoint tensors reproduces each row's unpadded encoder output.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_reference import stabilize_header, to_f32  # noqa: E402
from hf_reference_seq2seq import IndependentBart, close, encode, greedy, load_model, margin  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
import transformers  # noqa: E402

torch.set_num_threads(1)


def input_ids(length, stride, vocab):
    """<s>, length - 2 ids in 3..vocab-1 by `stride`, </s>."""
    body = [3 + (i * stride + 11) % (vocab - 3) for i in range(length - 2)]
    return [0] + body + [2]


def run_length(model, ind, length, n, t):
    cfg = model.config
    dtype = torch.float64
    a = input_ids(length, 37, cfg.vocab_size)
    b = input_ids(3 * length // 4, 53, cfg.vocab_size)
    pad = [cfg.pad_token_id] * (length - len(b))
    batch = torch.tensor([a, b + pad])
    mask = torch.tensor([[1] * length, [1] * len(b) + [0] * len(pad)])
    with torch.no_grad():
        enc = encode(model, batch, mask).last_hidden_state
        gen, steps = greedy(model, enc, mask, n, use_cache=True)
        gen_nc, steps_nc = greedy(model, enc, mask, n, use_cache=False)
        assert gen.tolist() == gen_nc.tolist(), (gen.tolist(), gen_nc.tolist())
        err = max((x - y).abs().max().item() for x, y in zip(steps, steps_nc))
        assert err <= 1e-9, err
        # Each row alone, unpadded.
        for row, ids in enumerate((a, b)):
            one = torch.tensor([ids])
            ones = torch.ones_like(one)
            enc1 = encode(model, one, ones).last_hidden_state
            close(enc[row, :len(ids)], enc1[0], dtype, f"L={length} row {row} encoder vs alone")
            gen1, steps1 = greedy(model, enc1, ones, n, use_cache=True)
            assert gen1[0].tolist() == gen[row].tolist(), (row, gen1.tolist(), gen.tolist())
            for k in range(n):
                close(steps[k][row], steps1[k][0], dtype, f"L={length} row {row} logits.{k} vs alone")
            hs = ind.encoder(torch.tensor(ids), torch.ones(len(ids), dtype=torch.long))
            close(hs[-1], enc[row, :len(ids)], dtype, f"L={length} row {row} independent encoder")
    p = f"len{length}.batch"
    t[f"{p}.input_ids"] = batch
    t[f"{p}.attention_mask"] = mask
    t[f"{p}.enc.last"] = enc
    t[f"{p}.generated_ids"] = gen
    for k, row in enumerate(steps):
        t[f"{p}.logits.{k}"] = row
    t[f"{p}.greedy_margin"] = torch.tensor([[margin(r[j]) for r in steps] for j in range(2)], dtype=torch.float64)
    print(f"  L={length}: rows {len(a)} and {len(b)} tokens; generated {gen.tolist()}; "
          f"cache vs no cache logits max diff {err:.2e}; min greedy margin {t[f'{p}.greedy_margin'].min().item():.3e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--lengths", default="128,512,2048")
    ap.add_argument("--max-new-tokens", type=int, default=4)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    model = load_model(args.model, torch.float64)
    cfg = model.config
    assert max(lengths) <= cfg.max_position_embeddings, (lengths, cfg.max_position_embeddings)
    ind = IndependentBart(os.path.join(args.model, "model.safetensors"), cfg)
    print(f"{args.model}: {type(model).__name__}, float64, lengths {lengths}, N={args.max_new_tokens}")
    t = {}
    for length in lengths:
        run_length(model, ind, length, args.max_new_tokens, t)
    meta = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "compute_dtype": "float64",
        "model": os.path.basename(os.path.normpath(args.model)),
        "lengths": args.lengths,
        "max_new_tokens": str(args.max_new_tokens),
        "padding_side": "right",
        "attn_implementation": "eager",
        "greedy": "argmax of raw logits, no logits processors, no EOS stop",
    }
    save_file(to_f32(t), args.out, metadata=meta)
    stabilize_header(args.out)
    print(f"  wrote {args.out} ({os.path.getsize(args.out) / 1024:.1f} KiB)")


if __name__ == "__main__":
    main()
