#!/usr/bin/env python3
"""Dump a layer-by-layer Hugging Face transformers reference for a tiny causal LM.

Run from the repository root:

    tools/.venv/bin/python tools/hf_reference.py --model tests/models/llama-gqa \\
        (--prompt-ids 1,17,42 | --prompt "some text") [--max-new-tokens 32] \\
        [--dtype float32|float64|bfloat16] --out FILE [--check]

The model is loaded with `attn_implementation="eager"` in the compute dtype (default:
float64 for float32 checkpoints, bfloat16 for bfloat16 checkpoints). One prefill call on the
prompt (batch 1) is recorded, then N = --max-new-tokens greedy steps are run with the KV cache,
one `model(...)` call per token. The logits saved are the raw `outputs.logits` of those calls
(no logits processors).

Output: one safetensors file. Floating tensors are float32 (converted from the compute
dtype), 2-D `[T, features]` for the prefill with the batch dimension dropped.

* `prompt_ids` int64 [T]; `generated_ids` int64 [N]. generated_ids[0] = argmax of the last
  row of `logits.0`; generated_ids[k] = argmax of `logits.{k}`.
* `hidden.{i}`, i = 0..=L: `output_hidden_states` of the prefill. In transformers 5.24 these
  are captured by forward hooks on the decoder layers (utils/output_capturing.py): entry 0 is
  the input of layer 0 (the embeddings), entry i is the output of layer i-1, and then
  `capture_outputs(tie_last_hidden_states=True)` replaces the LAST entry with
  `last_hidden_state`, i.e. the output of the final norm. So `hidden.{L}` is AFTER the final
  RMSNorm (and `layer.{L-1}.out` is the same tensor before it), while for l < L-1
  `layer.{l}.out == hidden.{l+1}`. Both facts are asserted below.
* per layer l (prefill):
  `layer.{l}.attn_norm`  input_layernorm output [T, H]
  `layer.{l}.q`          queries after q_norm (Qwen3) and RoPE [T, n_heads*head_dim]
  `layer.{l}.k`          keys after k_norm (Qwen3) and RoPE [T, n_kv*head_dim]
                         (heads flattened in head order: column h*head_dim + d)
  `layer.{l}.attn_out`   attention output before o_proj [T, n_heads*head_dim]
  `layer.{l}.o_proj`     o_proj output [T, H]
  `layer.{l}.post_attn`  residual after attention = layer input + o_proj [T, H]
  `layer.{l}.ffn_norm`   post_attention_layernorm output [T, H]
  `layer.{l}.ffn_out`    MLP output [T, H]
  `layer.{l}.out`        layer output [T, H]
  q/k are captured by wrapping the modeling module's `apply_rotary_pos_emb` (the attention
  forward looks it up as a module global at call time); the rest by forward hooks/pre-hooks.
  MoE models (Mixtral, Qwen2-MoE) additionally get, per layer (prefill):
  `layer.{l}.router_logits` the router's logits before the softmax [T, n_experts]
                         (output 0 of `mlp.gate`, batch and sequence already flattened)
  `layer.{l}.shared_out` Qwen2-MoE only: the shared expert's output AFTER the multiplication
                         by sigmoid(shared_expert_gate(x)) [T, H], computed from the two
                         modules' outputs with the same two ops as the block's forward
  and `layer.{l}.ffn_out` is the whole sparse-MoE block output (routed experts + shared).
  MoE models are loaded with `experts_implementation="eager"` (the per-expert loop in the
  modeling file) rather than the default `grouped_mm`; the difference between the two is
  printed and asserted to be rounding-level.
* `logits.0` prefill logits [T, V]; `logits.{k}` (k = 1..N-1) the [1, V] logits of decode step k.
* extras: `rope.inv_freq` [head_dim/2] inverse frequencies the prefill used; `rope.cos`,
  `rope.sin` [T, head_dim] the prefill's cos/sin as passed to attention (they already include
  the RoPE `attention_scaling`, e.g. YaRN's mscale); `rope.decode_inv_freq` [N-1, head_dim/2]
  the inverse frequencies each decode step k used (differs per step only for dynamic NTK);
  `greedy_margin` [N] top-1 minus top-2 logit of each greedy choice (a small margin means an
  implementation with different rounding may legitimately pick another token).

Tokenization with --prompt uses `tokenizers.Tokenizer.from_file(<model>/tokenizer.json)`;
`prompt_ids` are stored exactly as it produced them. For the tokenizers made by
tools/make_tiny_models.py that INCLUDES the BOS `<s>` (id 1) its post-processor prepends.

Numerics of the HF reference even at float64 compute: RMSNorm casts its input to float32
for the variance/rsqrt (then back), eager softmax runs in float32, and the RoPE angles
(position * inv_freq) and inv_freq are computed in float32 before cos/sin are cast to the
compute dtype. So "float64" references carry float32-level rounding (~1e-7 relative) at
those points.

Sanity checks (assertions): hidden.{L} -> lm_head == logits.0; norm(layer.{L-1}.out) ==
hidden.{L}; layer.{l}.out == hidden.{l+1} for l < L-1; post_attn == input + o_proj;
out == post_attn + ffn_out; attention recomputed independently from the dumped q/k
(v = v_proj(attn_norm); query head h reads kv head h // (n_heads/n_kv)) == attn_out; decode logits == a cache-free forward of the whole sequence to 5e-6 (not
asserted for dynamic NTK RoPE, where HF's cached keys keep the rotation of the step that
wrote them, nor for bfloat16, where only the difference is printed). For models with a
sliding window, a second run with the window disabled must differ exactly from row
`window` on. For dynamic RoPE the prompt must exceed max_position_embeddings. For MoE
models, the block output is recomputed in float64 from the dumped router logits and the
weights read from the checkpoint's per-expert hub-layout tensors (softmax, top-k, Mixtral's
renormalization / Qwen2-MoE's norm_topk_prob, SiLU experts, sigmoid-gated shared expert)
and must equal `ffn_out` (and `shared_out`); the dumped router logits must equal
ffn_norm @ gate.T; the smallest gap between the k-th and (k+1)-th routing probability of the
prefill is recorded (a tiny gap would make the expert choice rounding-sensitive).
"""

import argparse
import json
import os
import struct
import sys

import torch

torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import safetensors  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def moe_kind(cfg):
    """'mixtral', 'qwen2_moe' or None."""
    return cfg.model_type if cfg.model_type in ("mixtral", "qwen2_moe") else None


def load_model(model_dir, dtype, **overrides):
    cfg = AutoConfig.from_pretrained(model_dir)
    if moe_kind(cfg) is not None:
        overrides.setdefault("experts_implementation", "eager")
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=dtype, attn_implementation="eager", **overrides
    )
    model.eval()
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    if moe_kind(cfg) is not None:
        assert model.config._experts_implementation == overrides["experts_implementation"], (
            model.config._experts_implementation)
    return model


def tol_for(dtype):
    return {torch.float64: 1e-9, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]


def close(a, b, dtype, what):
    a = a.double()
    b = b.double()
    scale = max(1.0, b.abs().max().item())
    err = (a - b).abs().max().item()
    assert err <= tol_for(dtype) * scale, f"{what}: max abs diff {err:.3e} (scale {scale:.3g})"
    return err


class Recorder:
    """Forward hooks plus the apply_rotary_pos_emb wrapper; records only while `on`."""

    def __init__(self, model):
        self.model = model
        self.on = False
        self.cur_layer = None
        self.store = {}
        self.shared_pre_gate = None
        self.rope_inv_freq = []
        self.handles = []
        self.modeling = sys.modules[type(model).__module__]
        self.orig_rope_fn = self.modeling.apply_rotary_pos_emb
        inner = model.model
        for l, layer in enumerate(inner.layers):
            attn = layer.self_attn
            self.handles += [
                attn.register_forward_pre_hook(self._set_layer(l)),
                layer.input_layernorm.register_forward_hook(self._out(f"layer.{l}.attn_norm")),
                attn.o_proj.register_forward_pre_hook(self._in(f"layer.{l}.attn_out")),
                attn.o_proj.register_forward_hook(self._out(f"layer.{l}.o_proj")),
                layer.post_attention_layernorm.register_forward_pre_hook(self._in(f"layer.{l}.post_attn")),
                layer.post_attention_layernorm.register_forward_hook(self._out(f"layer.{l}.ffn_norm")),
                layer.mlp.register_forward_hook(self._out(f"layer.{l}.ffn_out")),
                layer.register_forward_hook(self._out(f"layer.{l}.out")),
            ]
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(layer.mlp, "experts"):
                # The router sees the flattened [B*T, H] states and returns (logits, scores, indices).
                self.handles.append(gate.register_forward_hook(self._out_flat(f"layer.{l}.router_logits")))
            if hasattr(layer.mlp, "shared_expert_gate"):
                self.handles += [
                    layer.mlp.shared_expert.register_forward_hook(self._keep_shared),
                    layer.mlp.shared_expert_gate.register_forward_hook(self._shared_out(f"layer.{l}.shared_out")),
                ]
        self.handles.append(inner.rotary_emb.register_forward_hook(self._rope))

        recorder = self

        def wrapped_apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
            q_embed, k_embed = recorder.orig_rope_fn(q, k, cos, sin, *args, **kwargs)
            if recorder.on:
                # [B, heads, T, D] -> [T, heads*D]
                for name, t in (("q", q_embed), ("k", k_embed)):
                    b, h, s, d = t.shape
                    recorder._put(f"layer.{recorder.cur_layer}.{name}", t.transpose(1, 2).reshape(b, s, h * d))
            return q_embed, k_embed

        self.modeling.apply_rotary_pos_emb = wrapped_apply_rotary_pos_emb

    def close(self):
        self.modeling.apply_rotary_pos_emb = self.orig_rope_fn
        for h in self.handles:
            h.remove()

    def _put(self, key, t):
        assert key not in self.store, f"{key} recorded twice"
        assert t.shape[0] == 1, "batch 1 only"
        self.store[key] = t[0].detach().clone()

    def _put_flat(self, key, t):
        """A [B*T, F] tensor of a module that flattens batch and sequence (batch 1: [T, F])."""
        assert key not in self.store, f"{key} recorded twice"
        assert t.dim() == 2, (key, tuple(t.shape))
        self.store[key] = t.detach().clone()

    def _out_flat(self, key):
        def hook(module, args, output):
            if self.on:
                self._put_flat(key, output[0] if isinstance(output, tuple) else output)
        return hook

    def _keep_shared(self, module, args, output):
        self.shared_pre_gate = output

    def _shared_out(self, key):
        # Qwen2MoeSparseMoeBlock.forward: F.sigmoid(self.shared_expert_gate(x)) * shared_expert_output;
        # the same two ops on the same tensors, so the result is bit-identical to the block's.
        def hook(module, args, output):
            if self.on:
                self._put_flat(key, torch.nn.functional.sigmoid(output) * self.shared_pre_gate)
            self.shared_pre_gate = None
        return hook

    def _set_layer(self, l):
        def hook(module, args):
            self.cur_layer = l
        return hook

    def _out(self, key):
        def hook(module, args, output):
            if self.on:
                self._put(key, output[0] if isinstance(output, tuple) else output)
        return hook

    def _in(self, key):
        def hook(module, args):
            if self.on:
                self._put(key, args[0])
        return hook

    def _rope(self, module, args, output):
        # Runs after dynamic_rope_update, so module.inv_freq is what this call used.
        self.rope_inv_freq.append(module.inv_freq.detach().clone())
        if self.on:
            cos, sin = output
            self._put("rope.cos", cos)
            self._put("rope.sin", sin)


def forward(model, ids, cache=None):
    kwargs = dict(input_ids=ids, use_cache=True, output_hidden_states=cache is None)
    if cache is not None:
        kwargs["cache"] = cache
    out = model(**kwargs)
    new_cache = getattr(out, "cache", None)
    if new_cache is None:
        new_cache = out.past_key_values
    return out, new_cache


def margin(row):
    top = torch.topk(row.double(), 2).values
    return (top[0] - top[1]).item()


def run_reference(model, prompt_ids, n_new):
    """Prefill (recorded) + greedy decode. Returns (tensors dict in compute dtype, generated)."""
    rec = Recorder(model)
    tensors = {}
    try:
        with torch.no_grad():
            ids = torch.tensor([prompt_ids], dtype=torch.long)
            rec.on = True
            out, cache = forward(model, ids)
            rec.on = False
            tensors.update(rec.store)
            tensors["rope.inv_freq"] = rec.rope_inv_freq[0]
            hs = out.hidden_states
            for i, h in enumerate(hs):
                tensors[f"hidden.{i}"] = h[0]
            tensors["logits.0"] = out.logits[0]
            gen = [int(out.logits[0, -1].argmax())]
            margins = [margin(out.logits[0, -1])]
            decode_inv_freq = []
            for k in range(1, n_new):
                out, cache = forward(model, torch.tensor([[gen[-1]]], dtype=torch.long), cache)
                assert out.logits.shape[:2] == (1, 1)
                decode_inv_freq.append(rec.rope_inv_freq[-1])
                row = out.logits[0, -1]
                tensors[f"logits.{k}"] = out.logits[0]
                gen.append(int(row.argmax()))
                margins.append(margin(row))
            if decode_inv_freq:
                tensors["rope.decode_inv_freq"] = torch.stack(decode_inv_freq)
    finally:
        rec.close()
    tensors["greedy_margin"] = torch.tensor(margins, dtype=torch.float64)
    return tensors, gen


def sanity_checks(model, tensors, prompt_ids, gen, dtype, args):
    cfg = model.config
    L = cfg.num_hidden_layers
    T = len(prompt_ids)
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    H, V = cfg.hidden_size, cfg.vocab_size
    report = {}

    assert len([k for k in tensors if k.startswith("hidden.")]) == L + 1
    for l in range(L):
        for name, width in (("attn_norm", H), ("q", n_heads * head_dim), ("k", n_kv * head_dim),
                            ("attn_out", n_heads * head_dim), ("o_proj", H), ("post_attn", H),
                            ("ffn_norm", H), ("ffn_out", H), ("out", H)):
            t = tensors[f"layer.{l}.{name}"]
            assert tuple(t.shape) == (T, width), (f"layer.{l}.{name}", tuple(t.shape))
    assert tuple(tensors["logits.0"].shape) == (T, V)
    kind = moe_kind(cfg)
    if kind is not None:
        n_exp = cfg.num_local_experts if kind == "mixtral" else cfg.num_experts
        for l in range(L):
            assert tuple(tensors[f"layer.{l}.router_logits"].shape) == (T, n_exp)
            if kind == "qwen2_moe":
                assert tuple(tensors[f"layer.{l}.shared_out"].shape) == (T, H)
    else:
        assert not any(k.endswith((".router_logits", ".shared_out")) for k in tensors)

    with torch.no_grad():
        close(model.lm_head(tensors[f"hidden.{L}"]), tensors["logits.0"], dtype, "lm_head(hidden.L) vs logits.0")
        close(model.model.norm(tensors[f"layer.{L - 1}.out"]), tensors[f"hidden.{L}"], dtype,
              "norm(layer.L-1.out) vs hidden.L")
        for l in range(L):
            inp = tensors[f"hidden.{l}"]
            if l < L - 1:
                close(tensors[f"layer.{l}.out"], tensors[f"hidden.{l + 1}"], dtype, f"layer.{l}.out vs hidden.{l + 1}")
            close(inp + tensors[f"layer.{l}.o_proj"], tensors[f"layer.{l}.post_attn"], dtype, f"layer.{l} post_attn")
            close(tensors[f"layer.{l}.post_attn"] + tensors[f"layer.{l}.ffn_out"], tensors[f"layer.{l}.out"], dtype,
                  f"layer.{l} out")

        # Recompute attention from the dumped q/k (plus v = v_proj(attn_norm)) with an independent
        # implementation: query head h uses kv head h // (n_heads / n_kv); scale head_dim^-0.5; causal,
        # and with a sliding window W query i sees keys j with i - W < j <= i.
        window = getattr(cfg, "sliding_window", None)
        layer_types = getattr(cfg, "layer_types", None)
        n_rep = n_heads // n_kv
        for l in range(L):
            attn = model.model.layers[l].self_attn
            q = tensors[f"layer.{l}.q"].view(T, n_heads, head_dim).transpose(0, 1)
            k = tensors[f"layer.{l}.k"].view(T, n_kv, head_dim).transpose(0, 1)
            v = attn.v_proj(tensors[f"layer.{l}.attn_norm"]).view(T, n_kv, head_dim).transpose(0, 1)
            i = torch.arange(T)[:, None]
            j = torch.arange(T)[None, :]
            allowed = j <= i
            layer_window = window if (layer_types is None or layer_types[l] == "sliding_attention") else None
            if layer_window is not None:
                allowed = allowed & (i - j < layer_window)
            outs = []
            for h in range(n_heads):
                s = (q[h].double() @ k[h // n_rep].double().T) * head_dim ** -0.5
                s = s.masked_fill(~allowed, float("-inf"))
                outs.append(torch.softmax(s, -1) @ v[h // n_rep].double())
            mine = torch.stack(outs, 1).reshape(T, n_heads * head_dim)
            cross_tol = {torch.float64: 5e-6, torch.float32: 1e-4, torch.bfloat16: 5e-2}[dtype]
            err = (mine - tensors[f"layer.{l}.attn_out"].double()).abs().max().item()
            assert err <= cross_tol, f"layer.{l} attention recomputed from q/k/v: max diff {err:.3e}"

        # Cached decode vs one cache-free forward over prompt + generated[:-1].
        full = torch.tensor([prompt_ids + gen[:-1]], dtype=torch.long)
        full_logits = model(input_ids=full, use_cache=False).logits[0]
        err = (full_logits[:T] - tensors["logits.0"]).abs().max().item()
        decode_err = 0.0
        for k in range(1, len(gen)):
            decode_err = max(decode_err, (full_logits[T - 1 + k] - tensors[f"logits.{k}"][0]).abs().max().item())
        rope_type = cfg.rope_parameters.get("rope_type", "default")
        report["nocache_prefill_maxdiff"] = err
        report["nocache_decode_maxdiff"] = decode_err
        print(f"  cache-free forward: prefill max diff {err:.3e}, decode max diff {decode_err:.3e}")
        if rope_type != "dynamic" and dtype != torch.bfloat16:
            # Different shapes round differently at the float32 cast points (softmax, RMSNorm), so even a
            # float64 run agrees only to float32-level noise here.
            cross_tol = {torch.float64: 5e-6, torch.float32: 1e-4}[dtype]
            assert err <= cross_tol and decode_err <= cross_tol, (err, decode_err)

        if kind is not None:
            report.update(moe_checks(model, tensors, T, dtype, args, full, full_logits))

        if rope_type == "dynamic":
            assert T > cfg.max_position_embeddings, (
                f"dynamic RoPE: prompt length {T} does not exceed max_position_embeddings "
                f"{cfg.max_position_embeddings}")
            orig = model.model.rotary_emb.original_inv_freq
            assert not torch.allclose(tensors["rope.inv_freq"].float(), orig.float()), "dynamic RoPE did not rescale"
            print(f"  dynamic RoPE: T={T} > max_position_embeddings={cfg.max_position_embeddings}; "
                  f"prefill inv_freq[-1]={tensors['rope.inv_freq'][-1].item():.6e} vs original "
                  f"{orig[-1].item():.6e}")

        uses_window = window is not None and (layer_types is None or "sliding_attention" in layer_types)
        if uses_window:
            plain = load_model(args.model, dtype, sliding_window=None)
            assert plain.config.sliding_window is None
            plain_logits = plain(input_ids=full, use_cache=False).logits[0]
            row_diff = (plain_logits - full_logits).abs().amax(-1)
            same_rows = [i for i in range(full.shape[1]) if row_diff[i] == 0]
            first_diff = next(i for i in range(full.shape[1]) if row_diff[i] > 0)
            print(f"  sliding window {window}: identical rows without the window: {same_rows}; "
                  f"first differing row {first_diff} (max diff there {row_diff[first_diff].item():.3e}, "
                  f"overall {row_diff.max().item():.3e})")
            # Query i sees keys j with i - j < window: rows 0..window-1 see everything anyway.
            assert same_rows == list(range(window)) and first_diff == window, (same_rows, first_diff)
            report["window_first_differing_row"] = first_diff
    return report


def moe_checks(model, tensors, T, dtype, args, full, full_logits):
    """Independent float64 recomputation of every sparse-MoE block of the prefill.

    Weights come from the checkpoint file itself in the hub's per-expert layout (not from the
    model's fused in-memory parameters), so this also checks that layout's meaning:
    Mixtral w1 = gate, w3 = up, w2 = down; Qwen2-MoE gate_proj / up_proj / down_proj.
    """
    cfg = model.config
    kind = moe_kind(cfg)
    L, H = cfg.num_hidden_layers, cfg.hidden_size
    weights = load_file(os.path.join(args.model, "model.safetensors"))
    if kind == "mixtral":
        n_exp, block, (g_name, u_name, d_name), renorm = cfg.num_local_experts, "block_sparse_moe", ("w1", "w3", "w2"), True
    else:
        n_exp, block, (g_name, u_name, d_name), renorm = (cfg.num_experts, "mlp", ("gate_proj", "up_proj", "down_proj"),
                                                          bool(cfg.norm_topk_prob))
    top_k = cfg.num_experts_per_tok
    tol = {torch.float64: 5e-6, torch.float32: 1e-4, torch.bfloat16: 5e-2}[dtype]

    def silu(a):
        return a / (1.0 + torch.exp(-a))

    report = {}
    worst = 0.0
    worst_shared = 0.0
    for l in range(L):
        def w(name):
            return weights[f"model.layers.{l}.{block}.{name}"].double()

        x = tensors[f"layer.{l}.ffn_norm"].double()
        logits = tensors[f"layer.{l}.router_logits"].double()
        close(x @ w("gate.weight").T, logits, dtype, f"layer.{l} router_logits vs ffn_norm @ gate.T")
        probs = torch.softmax(logits, dim=-1)
        routed = torch.zeros(T, H, dtype=torch.float64)
        for t in range(T):
            order = sorted(range(n_exp), key=lambda e: (-probs[t, e].item(), e))
            chosen = order[:top_k]
            cw = probs[t, chosen]
            if renorm:
                cw = cw / cw.sum()
            for e, we in zip(chosen, cw.tolist()):
                h = silu(x[t] @ w(f"experts.{e}.{g_name}.weight").T) * (x[t] @ w(f"experts.{e}.{u_name}.weight").T)
                routed[t] += we * (h @ w(f"experts.{e}.{d_name}.weight").T)
        mine = routed
        if kind == "qwen2_moe":
            shared = (silu(x @ w("shared_expert.gate_proj.weight").T) * (x @ w("shared_expert.up_proj.weight").T)) \
                @ w("shared_expert.down_proj.weight").T
            shared = shared / (1.0 + torch.exp(-(x @ w("shared_expert_gate.weight").T)))
            err = (shared - tensors[f"layer.{l}.shared_out"].double()).abs().max().item()
            assert err <= tol, f"layer.{l} shared_out recomputed: max diff {err:.3e}"
            worst_shared = max(worst_shared, err)
            mine = routed + shared
        err = (mine - tensors[f"layer.{l}.ffn_out"].double()).abs().max().item()
        assert err <= tol, f"layer.{l} MoE block recomputed from router logits and weights: max diff {err:.3e}"
        worst = max(worst, err)
    report["moe_recompute_maxdiff"] = worst
    if kind == "qwen2_moe":
        report["shared_recompute_maxdiff"] = worst_shared
    print(f"  MoE blocks recomputed in float64 from router logits + per-expert weights: max diff {worst:.3e}"
          + (f" (shared_out {worst_shared:.3e})" if kind == "qwen2_moe" else ""))

    # How close the top-k choice is to a tie: gap between the k-th and (k+1)-th routing
    # probability, over the prefill (the dumped router logits) and over the whole sequence
    # (router logits of the cache-free forward that covers the decode steps too).
    def min_gap(router_logits):
        p = torch.softmax(router_logits.double(), dim=-1).sort(dim=-1, descending=True).values
        return (p[:, top_k - 1] - p[:, top_k]).min().item()

    report["router_min_topk_gap_prefill"] = min(min_gap(tensors[f"layer.{l}.router_logits"]) for l in range(L))
    with torch.no_grad():
        rl_all = model(input_ids=full, use_cache=False, output_router_logits=True).router_logits
    assert len(rl_all) == L
    report["router_min_topk_gap_all"] = min(min_gap(r.reshape(-1, n_exp)) for r in rl_all)
    print(f"  router: min gap between top-{top_k} and next probability: prefill "
          f"{report['router_min_topk_gap_prefill']:.3e}, whole sequence {report['router_min_topk_gap_all']:.3e}")

    # The default experts implementation (grouped_mm) must agree with the eager loop up to rounding.
    # torch._grouped_mm accepts only float32/bfloat16/float16 ("Expected mat_a to be Float32,
    # BFloat16 or Float16 matrix, got Double"), so a float64 reference compares in float32.
    cmp_dtype = torch.float32 if dtype == torch.float64 else dtype
    with torch.no_grad():
        g_logits = load_model(args.model, cmp_dtype, experts_implementation="grouped_mm")(
            input_ids=full, use_cache=False).logits[0]
        e_logits = (full_logits if cmp_dtype == dtype else
                    load_model(args.model, cmp_dtype)(input_ids=full, use_cache=False).logits[0])
    err = (g_logits.double() - e_logits.double()).abs().max().item()
    err_ref = (g_logits.double() - full_logits.double()).abs().max().item()
    report["grouped_mm_vs_eager_maxdiff"] = err
    report["grouped_mm_compare_dtype"] = str(cmp_dtype).replace("torch.", "")
    print(f"  experts_implementation grouped_mm vs eager, both {cmp_dtype}: max logits diff {err:.3e} "
          f"(grouped_mm {cmp_dtype} vs this reference: {err_ref:.3e})")
    assert err <= {torch.float32: 1e-4, torch.bfloat16: 5e-2}.get(cmp_dtype, tol), err
    return report


def to_f32(tensors):
    out = {}
    for k, v in tensors.items():
        out[k] = v.detach().to(torch.float32).contiguous() if v.is_floating_point() else v.contiguous()
    return out


def stabilize_header(path):
    """Rewrite the safetensors header with the metadata keys sorted.

    safetensors serializes `__metadata__` from a hash map, so its key order (and the file's
    bytes) would change from run to run; sorting keeps regenerated files byte-identical.
    """
    with open(path, "r+b") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
        meta = header.pop("__metadata__", None)
        ordered = {}
        if meta is not None:
            ordered["__metadata__"] = dict(sorted(meta.items()))
        for k in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
            ordered[k] = header[k]
        raw = json.dumps(ordered, separators=(",", ":")).encode()
        if len(raw) > n:
            return
        fh.seek(8)
        fh.write(raw + b" " * (n - len(raw)))


def check_file(path):
    t = load_file(path)
    with safetensors.safe_open(path, "pt") as f:
        meta = f.metadata() or {}
    layers = sorted({int(k.split(".")[1]) for k in t if k.startswith("layer.")})
    logits = sorted(int(k.split(".")[1]) for k in t if k.startswith("logits."))
    print(f"{path}: {len(t)} tensors, {os.path.getsize(path) / 1024:.1f} KiB")
    for k in ("transformers", "torch", "compute_dtype", "model", "prompt", "rope_type"):
        print(f"  {k}: {meta.get(k)}")
    print(f"  prompt_ids ({t['prompt_ids'].numel()}): {t['prompt_ids'].tolist()}")
    print(f"  generated_ids ({t['generated_ids'].numel()}): {t['generated_ids'].tolist()}")
    print(f"  layers: {len(layers)}, hidden.* : {sum(k.startswith('hidden.') for k in t)}, logits.* : {len(logits)}")
    for k in ("hidden.0", "layer.0.q", "layer.0.k", "layer.0.attn_out", "logits.0", f"logits.{logits[-1]}"):
        print(f"  {k}: {tuple(t[k].shape)} {t[k].dtype} absmax {t[k].abs().max().item():.4g}")
    m = t["greedy_margin"]
    print(f"  greedy_margin min {m.min().item():.3e} at step {int(m.argmin())}")
    # The stored generated ids follow from the stored logits.
    for k, tok in enumerate(t["generated_ids"].tolist()):
        row = t[f"logits.{k}"][-1]
        if int(row.argmax()) != tok:
            print(f"  note: argmax of float32 logits.{k} != generated {tok} (margin {m[k].item():.2e})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt-ids")
    g.add_argument("--prompt")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--dtype", choices=sorted(DTYPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--check", action="store_true", help="reload the written file and print a summary")
    args = ap.parse_args()
    assert args.max_new_tokens >= 1

    cfg = AutoConfig.from_pretrained(args.model)
    ckpt_dtype = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
    if args.dtype:
        dtype = DTYPES[args.dtype]
    else:
        dtype = torch.bfloat16 if str(ckpt_dtype).endswith("bfloat16") else torch.float64

    if args.prompt is not None:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
        prompt_ids = tok.encode(args.prompt).ids
        prompt_desc = args.prompt
    else:
        prompt_ids = [int(x) for x in args.prompt_ids.split(",") if x.strip()]
        prompt_desc = "ids:" + ",".join(map(str, prompt_ids))
    assert prompt_ids and max(prompt_ids) < cfg.vocab_size and min(prompt_ids) >= 0

    model = load_model(args.model, dtype)
    print(f"{args.model}: {type(model).__name__}, compute {dtype}, T={len(prompt_ids)}, N={args.max_new_tokens}")
    tensors, gen = run_reference(model, prompt_ids, args.max_new_tokens)
    report = sanity_checks(model, tensors, prompt_ids, gen, dtype, args)

    tensors = to_f32(tensors)
    tensors["prompt_ids"] = torch.tensor(prompt_ids, dtype=torch.int64)
    tensors["generated_ids"] = torch.tensor(gen, dtype=torch.int64)
    meta = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "compute_dtype": str(dtype).replace("torch.", ""),
        "checkpoint_dtype": str(ckpt_dtype),
        "model": os.path.basename(os.path.normpath(args.model)),
        "architecture": type(model).__name__,
        "prompt": prompt_desc,
        "prompt_includes_bos": str(prompt_ids[0] == cfg.bos_token_id).lower(),
        "rope_type": model.config.rope_parameters.get("rope_type", "default"),
        "rope_parameters": json.dumps(model.config.rope_parameters, sort_keys=True),
        "attention_scaling": repr(float(model.model.rotary_emb.attention_scaling)),
        "sliding_window": str(getattr(model.config, "sliding_window", None)),
        "num_layers": str(model.config.num_hidden_layers),
        "max_new_tokens": str(args.max_new_tokens),
        "attn_implementation": "eager",
        "hidden_convention": "hidden.0=embeddings, hidden.i=output of layer i-1, hidden.L=after final norm",
        "sanity": json.dumps(report, sort_keys=True),
    }
    kind = moe_kind(model.config)
    if kind is not None:
        # Only MoE references carry these keys, so the older files stay byte-identical.
        meta["experts_implementation"] = model.config._experts_implementation
        meta["num_experts"] = str(model.config.num_local_experts if kind == "mixtral" else model.config.num_experts)
        meta["num_experts_per_tok"] = str(model.config.num_experts_per_tok)
        meta["topk_renormalized"] = str(True if kind == "mixtral" else bool(model.config.norm_topk_prob)).lower()
        meta["router_softmax_dtype"] = "float32"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_file(tensors, args.out, metadata=meta)
    stabilize_header(args.out)
    print(f"  wrote {args.out} ({os.path.getsize(args.out) / 1024:.1f} KiB); generated {gen}")
    print(f"  min greedy margin {min(tensors['greedy_margin'].tolist()):.3e}")
    if args.check:
        check_file(args.out)


if __name__ == "__main__":
    main()
