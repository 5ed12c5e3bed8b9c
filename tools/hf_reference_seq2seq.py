#!/usr/bin/env python3
"""Dump a layer-by-layer Hugging Face transformers reference for a tiny BART (encoder-decoder).

Run from the repository root:

    tools/.venv/bin/python tools/hf_reference_seq2seq.py --model tests/models/bart \\
        --input-ids 0,17,42,99,3,250,7,128,64,5,2 --batch-ids 0,200,33,77,150,2 \\
        [--max-new-tokens 32] [--dtype float64|float32] --out FILE [--check]

The model is loaded with `attn_implementation="eager"` in the compute dtype (default float64).
In float64 the whole BART forward is float64: its eager attention takes the softmax in the
compute dtype (models/bart/modeling_bart.py:133, unlike the Llama family's float32 softmax),
LayerNorm is torch's, GELU is the exact erf form.

Runs, all batch-first with `encoder_outputs` computed once per input:
1. single input (`--input-ids`, batch 1, no padding): the encoder (recorded), then N =
   --max-new-tokens greedy steps with the cache starting from `[[decoder_start_token_id]]`
   (one token per call, `model(encoder_outputs=..., attention_mask=..., decoder_input_ids=
   [[last token]], cache=..., use_cache=True)`), then one cache-free teacher-forced decoder pass
   over `decoder_input_ids = [start] + generated[:-1]` (recorded);
2. a padded batch of two: row 0 = `--input-ids`, row 1 = `--batch-ids` (must be shorter),
   right-padded with `pad_token_id` and `attention_mask` 0 there (BART's tokenizer pads on the
   right); encoder recorded; greedy decode with the cache as in 1 for both rows at once.
Greedy = argmax of the raw logits (no logits processors: not the `forced_bos/forced_eos`
of generation_config.json, no stop at EOS; always N steps).

Output: one safetensors file; floating tensors stored as float32, batch dropped for batch 1.
* `input_ids` i64 [S]; `generated_ids` i64 [N]; `decoder_input_ids` i64 [N] (start + generated[:-1]).
* `enc.hidden.{i}` [S, H], i = 0..=Le: 0 = embeddings (tokens + learned positions at ids
  0..S-1 offset by 2, then `layernorm_embedding`), i = output of encoder layer i-1 (BART has no
  final encoder LayerNorm, so `enc.hidden.{Le}` is the encoder output the decoder attends to).
* per encoder layer l (post-LayerNorm block):
  `enc.layer.{l}.attn_out`  self-attention module output (after out_proj, before the residual)
  `enc.layer.{l}.attn_ln`   self_attn_layer_norm(input + attn_out)
  `enc.layer.{l}.ffn_out`   fc2(gelu(fc1(attn_ln))) (before the residual)
  `enc.layer.{l}.out`       final_layer_norm(attn_ln + ffn_out) = layer output
* `dec.hidden.{i}` [N, H] and per decoder layer l, from the teacher-forced pass (row j is the
  decoder position j, input token decoder_input_ids[j]):
  `dec.layer.{l}.self_attn_out`  causal self-attention output (after out_proj, before residual)
  `dec.layer.{l}.self_attn_ln`   self_attn_layer_norm(input + self_attn_out)
  `dec.layer.{l}.cross_attn_out` cross-attention output (queries from self_attn_ln, keys and
                                 values from enc.hidden.{Le}; after out_proj, before residual)
  `dec.layer.{l}.cross_attn_ln`  encoder_attn_layer_norm(self_attn_ln + cross_attn_out)
  `dec.layer.{l}.ffn_out`        fc2(gelu(fc1(cross_attn_ln)))
  `dec.layer.{l}.out`            final_layer_norm(cross_attn_ln + ffn_out) = layer output
* `logits.{k}` [1, V], k = 0..N-1: the logits of cached decode step k (decoder position k),
  which chose generated_ids[k]; lm_head is tied to `model.shared.weight` and the buffer
  `final_logits_bias` [1, V] is added. (Unlike the causal references, `logits.0` is one row.)
* `greedy_margin` [N]: top-1 minus top-2 logit of each greedy pick.
* `batch.input_ids` i64 [2, S], `batch.attention_mask` i64 [2, S], `batch.enc.hidden.{i}`
  [2, S, H] (rows of padded positions are computed too but meaningless: compare where the mask
  is 1), `batch.generated_ids` i64 [2, N], `batch.logits.{k}` [2, V], `batch.greedy_margin` [2, N].

Sanity checks (assertions): greedy decoding with the cache and without it (a full decoder
forward per step) picks identical tokens, logits within 5e-6 (float64: 1e-9); the
teacher-forced pass reproduces the cached step logits; enc.layer.{l}.out == enc.hidden.{l+1},
dec.layer.{l}.out == dec.hidden.{l+1}; the LayerNorm/residual identities above; an
independent float64 implementation from the checkpoint tensors (token + position embeddings with
offset 2, post-LN layers, masked bidirectional encoder attention, causal decoder self-attention,
cross-attention, erf GELU, tied lm_head + final_logits_bias) reproduces every encoder hidden
state (single and batch, unmasked rows), every decoder layer output and the teacher-forced
logits; batch row 0 equals the single run and batch row 1 equals a single run of
`--batch-ids` (same generated tokens, encoder rows and logits within tolerance).
"""

import argparse
import json
import math
import os
import sys

import torch

torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import safetensors  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoConfig, AutoModelForSeq2SeqLM  # noqa: E402
from transformers.modeling_outputs import BaseModelOutput  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_reference import stabilize_header, to_f32  # noqa: E402

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def tol_for(dtype):
    return {torch.float64: 1e-9, torch.float32: 5e-6}[dtype]


def close(a, b, dtype, what, tol=None):
    a = a.double()
    b = b.double()
    scale = max(1.0, b.abs().max().item())
    err = (a - b).abs().max().item()
    limit = (tol if tol is not None else tol_for(dtype)) * scale
    assert err <= limit, f"{what}: max abs diff {err:.3e} (limit {limit:.3e})"
    return err


def load_model(model_dir, dtype):
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager")
    model.eval()
    assert model.config._attn_implementation == "eager"
    assert type(model).__name__ == "BartForConditionalGeneration", type(model).__name__
    return model


class Recorder:
    """Forward hooks on the encoder and decoder layers; `mode` picks which ones record."""

    def __init__(self, model):
        self.mode = None
        self.store = {}
        self.handles = []
        for l, layer in enumerate(model.model.encoder.layers):
            for mod, name in ((layer.self_attn, "attn_out"), (layer.self_attn_layer_norm, "attn_ln"),
                              (layer.fc2, "ffn_out"), (layer, "out")):
                self.handles.append(mod.register_forward_hook(self._hook("enc", f"enc.layer.{l}.{name}")))
        for l, layer in enumerate(model.model.decoder.layers):
            for mod, name in ((layer.self_attn, "self_attn_out"), (layer.self_attn_layer_norm, "self_attn_ln"),
                              (layer.encoder_attn, "cross_attn_out"),
                              (layer.encoder_attn_layer_norm, "cross_attn_ln"),
                              (layer.fc2, "ffn_out"), (layer, "out")):
                self.handles.append(mod.register_forward_hook(self._hook("dec", f"dec.layer.{l}.{name}")))

    def _hook(self, mode, key):
        def hook(module, args, output):
            if self.mode == mode:
                t = output[0] if isinstance(output, tuple) else output
                assert key not in self.store, f"{key} recorded twice"
                assert t.shape[0] == 1, "batch 1 only"
                self.store[key] = t[0].detach().clone()
        return hook

    def close(self):
        for h in self.handles:
            h.remove()


def new_cache(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def margin(row):
    top = torch.topk(row.double(), 2).values
    return (top[0] - top[1]).item()


def encode(model, ids, mask):
    return model.model.encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True)


def greedy(model, enc_last, mask, n, use_cache):
    """Greedy decode of n tokens for every row; returns (ids [B, n], per-step logits [B, V])."""
    start = model.config.decoder_start_token_id
    b = enc_last.shape[0]
    enc = BaseModelOutput(last_hidden_state=enc_last)
    dec_all = torch.full((b, 1), start, dtype=torch.long)
    cache = None
    steps = []
    with torch.no_grad():
        for _ in range(n):
            if use_cache:
                feed = dec_all[:, -1:]
                out = model(encoder_outputs=enc, attention_mask=mask, decoder_input_ids=feed, cache=cache,
                            use_cache=True)
                cache = new_cache(out)
                assert cache is not None
            else:
                out = model(encoder_outputs=enc, attention_mask=mask, decoder_input_ids=dec_all, use_cache=False)
            row = out.logits[:, -1]
            steps.append(row)
            dec_all = torch.cat([dec_all, row.argmax(-1, keepdim=True)], dim=1)
    return dec_all[:, 1:], steps


# ---- independent float64 implementation from the checkpoint tensors -------------------------

def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def gelu(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


class IndependentBart:
    """BART forward in float64 written from the architecture, not from transformers' modules."""

    def __init__(self, path, cfg):
        self.w = {k: v.double() for k, v in load_file(path).items()}
        self.cfg = cfg
        self.eps = 1e-5  # torch.nn.LayerNorm's default; BART builds its LayerNorms without eps
        self.emb = self.w["model.shared.weight"]

    def lin(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def ln(self, x, name):
        return layer_norm(x, self.w[name + ".weight"], self.w[name + ".bias"], self.eps)

    def mha(self, name, xq, xkv, allowed, n_heads):
        """xq [Tq, H], xkv [Tk, H]; allowed [Tq, Tk] bool."""
        tq, h = xq.shape
        d = h // n_heads
        q = self.lin(xq, name + ".q_proj").view(tq, n_heads, d).transpose(0, 1)
        k = self.lin(xkv, name + ".k_proj").view(-1, n_heads, d).transpose(0, 1)
        v = self.lin(xkv, name + ".v_proj").view(-1, n_heads, d).transpose(0, 1)
        s = (q @ k.transpose(1, 2)) * d ** -0.5
        s = s.masked_fill(~allowed[None], float("-inf"))
        o = torch.softmax(s, dim=-1) @ v
        return self.lin(o.transpose(0, 1).reshape(tq, h), name + ".out_proj")

    def embed(self, ids, part):
        pos = torch.arange(len(ids)) + 2  # BartLearnedPositionalEmbedding's offset
        x = self.emb[ids] + self.w[f"model.{part}.embed_positions.weight"][pos]  # scale_embedding False
        return self.ln(x, f"model.{part}.layernorm_embedding")

    def encoder(self, ids, mask):
        """ids [S], mask [S] (1 = real token); returns the list of hidden states (embeddings first)."""
        x = self.embed(ids, "encoder")
        allowed = mask.bool()[None, :].expand(len(ids), -1)
        hs = [x]
        for l in range(self.cfg.encoder_layers):
            p = f"model.encoder.layers.{l}"
            x = self.ln(x + self.mha(p + ".self_attn", x, x, allowed, self.cfg.encoder_attention_heads),
                        p + ".self_attn_layer_norm")
            x = self.ln(x + self.lin(gelu(self.lin(x, p + ".fc1")), p + ".fc2"), p + ".final_layer_norm")
            hs.append(x)
        return hs

    def decoder(self, dec_ids, enc_out, enc_mask):
        """Teacher-forced decoder; returns (layer outputs, logits [N, V])."""
        x = self.embed(dec_ids, "decoder")
        n = len(dec_ids)
        causal = torch.arange(n)[None, :] <= torch.arange(n)[:, None]
        cross = enc_mask.bool()[None, :].expand(n, -1)
        outs = []
        for l in range(self.cfg.decoder_layers):
            p = f"model.decoder.layers.{l}"
            x = self.ln(x + self.mha(p + ".self_attn", x, x, causal, self.cfg.decoder_attention_heads),
                        p + ".self_attn_layer_norm")
            x = self.ln(x + self.mha(p + ".encoder_attn", x, enc_out, cross, self.cfg.decoder_attention_heads),
                        p + ".encoder_attn_layer_norm")
            x = self.ln(x + self.lin(gelu(self.lin(x, p + ".fc1")), p + ".fc2"), p + ".final_layer_norm")
            outs.append(x)
        logits = x @ self.emb.T + self.w["final_logits_bias"][0]  # lm_head tied to model.shared
        return outs, logits


# ---- the reference run --------------------------------------------------------------------------

def run(model, ids_a, ids_b, n, dtype):
    cfg = model.config
    pad = cfg.pad_token_id
    assert len(ids_b) < len(ids_a), "--batch-ids must be shorter than --input-ids (it gets padded)"
    t = {}
    report = {}
    rec = Recorder(model)
    try:
        with torch.no_grad():
            # 1. single input
            a = torch.tensor([ids_a])
            mask_a = torch.ones_like(a)
            rec.mode = "enc"
            enc_a = encode(model, a, mask_a)
            rec.mode = None
            for i, h in enumerate(enc_a.hidden_states):
                t[f"enc.hidden.{i}"] = h[0]
            gen_a, steps_a = greedy(model, enc_a.last_hidden_state, mask_a, n, use_cache=True)
            gen_a_nc, steps_a_nc = greedy(model, enc_a.last_hidden_state, mask_a, n, use_cache=False)
            assert gen_a.tolist() == gen_a_nc.tolist(), (gen_a.tolist(), gen_a_nc.tolist())
            err = max((x - y).abs().max().item() for x, y in zip(steps_a, steps_a_nc))
            report["nocache_logits_maxdiff"] = err
            print(f"  greedy with vs without cache: identical tokens; logits max diff {err:.3e}")
            assert err <= {torch.float64: 1e-9, torch.float32: 5e-6}[dtype], err
            gen = gen_a[0].tolist()
            for k, row in enumerate(steps_a):
                t[f"logits.{k}"] = row
            t["greedy_margin"] = torch.tensor([margin(r[0]) for r in steps_a], dtype=torch.float64)

            dec_ids = [cfg.decoder_start_token_id] + gen[:-1]
            rec.mode = "dec"
            tf = model(encoder_outputs=BaseModelOutput(last_hidden_state=enc_a.last_hidden_state),
                       attention_mask=mask_a, decoder_input_ids=torch.tensor([dec_ids]), use_cache=False,
                       output_hidden_states=True)
            rec.mode = None
            for i, h in enumerate(tf.decoder_hidden_states):
                t[f"dec.hidden.{i}"] = h[0]
            tf_logits = tf.logits[0]
            assert tf_logits.argmax(-1).tolist() == gen
            err = max((tf_logits[k] - steps_a[k][0]).abs().max().item() for k in range(n))
            report["teacher_forced_vs_cached_maxdiff"] = err
            print(f"  teacher-forced decoder pass vs cached steps: logits max diff {err:.3e}")
            assert err <= {torch.float64: 1e-9, torch.float32: 5e-6}[dtype], err
            t.update(rec.store)

            # 2. padded batch of two
            s = len(ids_a)
            b_pad = list(ids_b) + [pad] * (s - len(ids_b))
            batch = torch.tensor([list(ids_a), b_pad])
            bmask = torch.tensor([[1] * s, [1] * len(ids_b) + [0] * (s - len(ids_b))])
            enc_b = encode(model, batch, bmask)
            for i, h in enumerate(enc_b.hidden_states):
                t[f"batch.enc.hidden.{i}"] = h
            bgen, bsteps = greedy(model, enc_b.last_hidden_state, bmask, n, use_cache=True)
            bgen_nc, bsteps_nc = greedy(model, enc_b.last_hidden_state, bmask, n, use_cache=False)
            assert bgen.tolist() == bgen_nc.tolist()
            err = max((x - y).abs().max().item() for x, y in zip(bsteps, bsteps_nc))
            report["batch_nocache_logits_maxdiff"] = err
            print(f"  batch greedy with vs without cache: identical tokens; logits max diff {err:.3e}")
            assert err <= {torch.float64: 1e-9, torch.float32: 5e-6}[dtype], err
            for k, row in enumerate(bsteps):
                t[f"batch.logits.{k}"] = row
            t["batch.greedy_margin"] = torch.tensor([[margin(r[j]) for r in bsteps] for j in range(2)],
                                                   dtype=torch.float64)

            # batch row 0 == single run; row 1 == a single run of ids_b
            assert bgen[0].tolist() == gen, (bgen[0].tolist(), gen)
            b1 = torch.tensor([list(ids_b)])
            enc_b1 = encode(model, b1, torch.ones_like(b1))
            gen_b1, steps_b1 = greedy(model, enc_b1.last_hidden_state, torch.ones_like(b1), n, use_cache=True)
            assert bgen[1].tolist() == gen_b1[0].tolist(), (bgen[1].tolist(), gen_b1[0].tolist())
            lb = len(ids_b)
            for i in range(len(enc_b.hidden_states)):
                close(enc_b.hidden_states[i][0], enc_a.hidden_states[i][0], dtype, f"batch row 0 enc.hidden.{i}")
                close(enc_b.hidden_states[i][1, :lb], enc_b1.hidden_states[i][0], dtype, f"batch row 1 enc.hidden.{i}")
            err0 = max((bsteps[k][0] - steps_a[k][0]).abs().max().item() for k in range(n))
            err1 = max((bsteps[k][1] - steps_b1[k][0]).abs().max().item() for k in range(n))
            report["batch_vs_single_logits_maxdiff"] = max(err0, err1)
            print(f"  batch rows vs single runs: same tokens; logits max diff row 0 {err0:.3e}, row 1 {err1:.3e}")
            assert max(err0, err1) <= {torch.float64: 1e-9, torch.float32: 5e-6}[dtype]
    finally:
        rec.close()

    t["input_ids"] = torch.tensor(ids_a, dtype=torch.int64)
    t["generated_ids"] = torch.tensor(gen, dtype=torch.int64)
    t["decoder_input_ids"] = torch.tensor(dec_ids, dtype=torch.int64)
    t["batch.input_ids"] = batch
    t["batch.attention_mask"] = bmask
    t["batch.generated_ids"] = bgen
    return t, tf_logits, report


def sanity_checks(model, t, tf_logits, args, dtype):
    cfg = model.config
    le, ld = cfg.encoder_layers, cfg.decoder_layers
    s, n, h = t["input_ids"].numel(), t["generated_ids"].numel(), cfg.d_model
    report = {}
    for l in range(le):
        for name in ("attn_out", "attn_ln", "ffn_out", "out"):
            assert tuple(t[f"enc.layer.{l}.{name}"].shape) == (s, h), name
    for l in range(ld):
        for name in ("self_attn_out", "self_attn_ln", "cross_attn_out", "cross_attn_ln", "ffn_out", "out"):
            assert tuple(t[f"dec.layer.{l}.{name}"].shape) == (n, h), name
    assert len([k for k in t if k.startswith("enc.hidden.")]) == le + 1
    assert len([k for k in t if k.startswith("dec.hidden.")]) == ld + 1

    with torch.no_grad():
        for l in range(le):
            layer = model.model.encoder.layers[l]
            inp = t[f"enc.hidden.{l}"]
            close(t[f"enc.layer.{l}.out"], t[f"enc.hidden.{l + 1}"], dtype, f"enc.layer.{l}.out vs enc.hidden.{l + 1}")
            close(layer.self_attn_layer_norm(inp + t[f"enc.layer.{l}.attn_out"]), t[f"enc.layer.{l}.attn_ln"], dtype,
                  f"enc.layer.{l}.attn_ln")
            close(layer.final_layer_norm(t[f"enc.layer.{l}.attn_ln"] + t[f"enc.layer.{l}.ffn_out"]),
                  t[f"enc.layer.{l}.out"], dtype, f"enc.layer.{l}.out")
        for l in range(ld):
            layer = model.model.decoder.layers[l]
            inp = t[f"dec.hidden.{l}"]
            p = f"dec.layer.{l}"
            close(t[f"{p}.out"], t[f"dec.hidden.{l + 1}"], dtype, f"{p}.out vs dec.hidden.{l + 1}")
            close(layer.self_attn_layer_norm(inp + t[f"{p}.self_attn_out"]), t[f"{p}.self_attn_ln"], dtype,
                  f"{p}.self_attn_ln")
            close(layer.encoder_attn_layer_norm(t[f"{p}.self_attn_ln"] + t[f"{p}.cross_attn_out"]),
                  t[f"{p}.cross_attn_ln"], dtype, f"{p}.cross_attn_ln")
            close(layer.final_layer_norm(t[f"{p}.cross_attn_ln"] + t[f"{p}.ffn_out"]), t[f"{p}.out"], dtype,
                  f"{p}.out")
        close(model.lm_head(t[f"dec.hidden.{ld}"]) + model.final_logits_bias[0], tf_logits, dtype,
              "lm_head(dec.hidden.L) + final_logits_bias")

    # Independent float64 implementation.
    ind = IndependentBart(os.path.join(args.model, "model.safetensors"), cfg)
    tol = {torch.float64: 1e-9, torch.float32: 5e-5}[dtype]
    ids = t["input_ids"]
    hs = ind.encoder(ids, torch.ones_like(ids))
    worst = 0.0
    for i, x in enumerate(hs):
        worst = max(worst, close(x, t[f"enc.hidden.{i}"], dtype, f"independent enc.hidden.{i}", tol))
    outs, logits = ind.decoder(t["decoder_input_ids"], hs[-1], torch.ones_like(ids))
    for l, x in enumerate(outs):
        worst = max(worst, close(x, t[f"dec.layer.{l}.out"], dtype, f"independent dec.layer.{l}.out", tol))
    worst = max(worst, close(logits, tf_logits, dtype, "independent teacher-forced logits", tol))
    for k in range(logits.shape[0]):
        worst = max(worst, close(logits[k], t[f"logits.{k}"][0], dtype, f"independent logits.{k}", tol))
    bmask = t["batch.attention_mask"]
    for row in range(2):
        real = int(bmask[row].sum())
        hs_b = ind.encoder(t["batch.input_ids"][row], bmask[row])
        for i, x in enumerate(hs_b):
            worst = max(worst, close(x[:real], t[f"batch.enc.hidden.{i}"][row, :real], dtype,
                                     f"independent batch row {row} enc.hidden.{i}", tol))
    report["independent_maxdiff"] = worst
    print(f"  independent float64 BART (encoder, decoder layers, logits, padded batch): max diff {worst:.3e}")
    return report


def check_file(path):
    t = load_file(path)
    with safetensors.safe_open(path, "pt") as f:
        meta = f.metadata() or {}
    print(f"{path}: {len(t)} tensors, {os.path.getsize(path) / 1024:.1f} KiB")
    for k in ("transformers", "torch", "compute_dtype", "model", "input_ids", "batch_ids", "decoder_start_token_id"):
        print(f"  {k}: {meta.get(k)}")
    for k in ("input_ids", "generated_ids", "decoder_input_ids", "batch.attention_mask", "batch.generated_ids"):
        print(f"  {k} {tuple(t[k].shape)}: {t[k].tolist()}")
    for k in ("enc.hidden.0", "enc.layer.0.attn_out", "dec.layer.0.cross_attn_out", "logits.0",
              "batch.enc.hidden.0", "batch.logits.0"):
        print(f"  {k}: {tuple(t[k].shape)} {t[k].dtype} absmax {t[k].abs().max().item():.4g}")
    m = t["greedy_margin"]
    print(f"  greedy_margin min {m.min().item():.3e} at step {int(m.argmin())}; batch min "
          f"{t['batch.greedy_margin'].min().item():.3e}")


def parse_ids(text):
    return [int(x) for x in text.split(",") if x.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--input-ids", required=True)
    ap.add_argument("--batch-ids", required=True, help="second (shorter) encoder input of the padded batch")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float64")
    ap.add_argument("--out", required=True)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    dtype = DTYPES[args.dtype]
    cfg = AutoConfig.from_pretrained(args.model)
    ids_a, ids_b = parse_ids(args.input_ids), parse_ids(args.batch_ids)
    assert max(ids_a + ids_b) < cfg.vocab_size and min(ids_a + ids_b) >= 0
    assert args.max_new_tokens + 1 <= cfg.max_position_embeddings

    model = load_model(args.model, dtype)
    print(f"{args.model}: {type(model).__name__}, compute {dtype}, S={len(ids_a)}, N={args.max_new_tokens}")
    t, tf_logits, report = run(model, ids_a, ids_b, args.max_new_tokens, dtype)
    report.update(sanity_checks(model, t, tf_logits, args, dtype))

    t = to_f32(t)
    meta = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "compute_dtype": str(dtype).replace("torch.", ""),
        "model": os.path.basename(os.path.normpath(args.model)),
        "architecture": type(model).__name__,
        "input_ids": ",".join(map(str, ids_a)),
        "batch_ids": ",".join(map(str, ids_b)),
        "padding_side": "right",
        "pad_token_id": str(cfg.pad_token_id),
        "decoder_start_token_id": str(cfg.decoder_start_token_id),
        "max_new_tokens": str(args.max_new_tokens),
        "attn_implementation": "eager",
        "greedy": "argmax of raw logits, no logits processors, no EOS stop",
        "hidden_convention": "enc.hidden.0=embeddings after layernorm_embedding, enc.hidden.i=output of encoder "
                             "layer i-1 (no final encoder norm); dec.hidden likewise for the teacher-forced pass",
        "sanity": json.dumps(report, sort_keys=True),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_file(t, args.out, metadata=meta)
    stabilize_header(args.out)
    print(f"  wrote {args.out} ({os.path.getsize(args.out) / 1024:.1f} KiB); generated {t['generated_ids'].tolist()}")
    print(f"  batch generated {t['batch.generated_ids'].tolist()}")
    print(f"  min greedy margin {t['greedy_margin'].min().item():.3e}")
    if args.check:
        check_file(args.out)


if __name__ == "__main__":
    main()
