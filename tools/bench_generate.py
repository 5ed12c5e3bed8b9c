#!/usr/bin/env python3
"""Generation speed: `lz generate` against HF transformers (and llama.cpp when installed),
same model, same prompt, same threads, in interleaved rounds; prints prefill and decode
tokens/s per engine and our ratio to each (medians).

    tools/.venv/bin/python tools/bench_generate.py [--threads 2] [--prompt 512] [--new 128]
        [--rounds 3] [--dtype f32 bf16] [--lz target/release/lz] [--dir /tmp/lz-bench-125m]

The model is a ~125M-parameter Llama (hidden 768, 12 layers, 12 heads, 4 KV heads,
intermediate 2048, vocab 32000) with random weights, written once to --dir in f32 and bf16.
Only speed is compared, so random weights are fine. Build ours first:
`cargo build --release -p layerzero-cli --bin lz`. llama.cpp is measured when the
`llama_cpp` (llama-cpp-python) and `gguf` packages are importable (the model is written once
to GGUF under --dir, f32 or bf16 as it is); otherwise it is reported as not installed. With `--tune SECONDS`, `lz workload` and `lz tune` first measure the model's own
ops into a PerfDB under --dir (LAYERZERO_HOME), so selection is measured rather than modeled.

`--quant int8 int4` adds quantized rows: ours `lz generate --weights int8|int4` on the f32
model against llama.cpp's Q8_0 and Q4_0 of the same weights (the seven projections of each
layer quantized by the `gguf` package, embeddings and output f32, as ours keeps them), and
each one's logits error against its own f32 model: on the prompt's last token (max |diff|
over max |logit|, and the relative L2 error), and the relative L2 error's mean over every
prompt position.
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


def ours(lz: str, model: Path, prompt: list, new: int, threads: int, home: Path, extra=()) -> tuple:
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), LAYERZERO_HOME=str(home))
    out = subprocess.run(
        [lz, "generate", "--model", str(model), "--prompt-ids", ",".join(map(str, prompt)),
         "--max-new-tokens", str(new), "--ignore-eos", "--json", *extra],
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


def ours_logits(lz: str, model: Path, prompt: list, home: Path, extra=()):
    """Our logits at every prompt position (`lz generate --dump`), `[positions, vocab]`."""
    import tempfile

    from safetensors.numpy import load_file
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([lz, "generate", "--model", str(model), "--prompt-ids", ",".join(map(str, prompt)),
                        "--max-new-tokens", "1", "--dump", d, *extra],
                       env=dict(os.environ, LAYERZERO_HOME=str(home)), check=True, capture_output=True)
        return load_file(str(Path(d) / "dump.safetensors"))["logits.0"].astype("float64")


def logits_error(got, want) -> tuple:
    """For `[positions, vocab]` logits: at the last position (max |got - want| / max |want|,
    ||got - want|| / ||want||), and the relative L2 error's mean over every position (one
    token's error moves with its rounding; the mean over a 512-token prompt is steadier)."""
    import numpy as np
    d = got - want
    last = (float(np.abs(d[-1]).max() / np.abs(want[-1]).max()), float(np.linalg.norm(d[-1]) / np.linalg.norm(want[-1])))
    rows = np.linalg.norm(d, axis=1) / np.linalg.norm(want, axis=1)
    return (*last, float(rows.mean()))


# The projections llama.cpp's Q8_0 / Q4_0 quantize here (its own conversions would also
# quantize the embeddings and write the output in Q6_K; kept f32 on both sides instead).
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def write_gguf(src: Path, out: Path, dtype: str, quant: str | None = None) -> None:
    """The HF model at `src` as a GGUF llama file (tensor names and metadata as llama.cpp
    reads them; a placeholder SPM vocabulary of the model's size, since ids are fed in
    directly). Q and K rows keep HF's order: the weights are random, only speed counts."""
    if out.exists():
        return
    import gguf
    import numpy as np
    from safetensors.numpy import load_file
    cfg = json.loads((src / "config.json").read_text())
    st = {}
    for f in sorted(src.glob("*.safetensors")):
        st.update(load_file(f) if dtype == "f32" else _load_bf16_bits(f))
    w = gguf.GGUFWriter(str(out), "llama")
    heads, kv, hidden = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(hidden // heads)
    theta = cfg.get("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    qtype = {"int8": gguf.GGMLQuantizationType.Q8_0, "int4": gguf.GGMLQuantizationType.Q4_0}.get(quant)
    file_type = {"int8": gguf.LlamaFileType.MOSTLY_Q8_0, "int4": gguf.LlamaFileType.MOSTLY_Q4_0}.get(
        quant, gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_BF16)
    w.add_file_type(file_type)
    vocab = cfg["vocab_size"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens = (tokens + [f"t{i}" for i in range(max(0, vocab - len(tokens)))])[:vocab]
    types = ([2, 3, 3] + [6] * 256 + [1] * max(0, vocab - 259))[:vocab]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * vocab)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}
    for l in range(cfg["num_hidden_layers"]):
        for hf, gg in per_layer.items():
            names[f"model.layers.{l}.{hf}.weight"] = f"blk.{l}.{gg}.weight"
    for hf, gg in names.items():
        t = st[hf]
        if qtype is not None and gg.split(".")[-2] in PROJECTIONS:
            arr = t.astype(np.float32) if t.dtype != np.uint16 else _bf16_to_f32(t)
            q = gguf.quants.quantize(arr, qtype)
            w.add_tensor(gg, q, raw_dtype=qtype)
        elif t.ndim == 1 or dtype == "f32":
            # Norm weights stay f32 in llama.cpp's own conversions.
            arr = t.astype(np.float32) if t.dtype != np.uint16 else _bf16_to_f32(t)
            w.add_tensor(gg, arr)
        else:
            w.add_tensor(gg, t, raw_shape=t.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _load_bf16_bits(f: Path) -> dict:
    """A bf16 safetensors file as uint16 arrays (numpy has no bf16)."""
    import numpy as np
    raw = f.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.uint16).reshape(meta["shape"])
    return out


def _bf16_to_f32(bits):
    import numpy as np
    return (bits.astype(np.uint32) << 16).view(np.float32)


class LlamaCpp:
    def __init__(self, path: Path, threads: int, ctx: int, logits_all: bool = False):
        from llama_cpp import Llama
        self.llm = Llama(model_path=str(path), n_ctx=ctx, n_batch=512, n_ubatch=512, n_threads=threads,
                         n_threads_batch=threads, logits_all=logits_all, verbose=False)

    def all_logits(self, prompt: list):
        """The logits at every position of `prompt` (made with `logits_all`), `[positions, vocab]`."""
        self.llm.reset()
        self.llm.eval(prompt)
        return self.llm.scores[:len(prompt)].astype("float64").copy()

    def last_logits(self):
        """The logits of the last token evaluated, read in place from the context."""
        import numpy as np
        return np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),))

    def run(self, prompt: list, new: int) -> tuple:
        import numpy as np
        llm = self.llm
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)
        token = int(np.argmax(self.last_logits()))
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(new - 1):
            llm.eval([token])
            token = int(np.argmax(self.last_logits()))
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
    ap.add_argument("--dtype", nargs="*", default=["f32", "bf16"], help="float rows (none: only --quant rows)")
    ap.add_argument("--lz", default="target/release/lz")
    ap.add_argument("--dir", default="/tmp/lz-bench-125m")
    ap.add_argument("--quant", nargs="*", default=[], choices=["int8", "int4"],
                    help="quantized rows: ours --weights int8|int4 against llama.cpp Q8_0|Q4_0")
    ap.add_argument("--tune", type=int, default=0, metavar="SECONDS",
                    help="measure the model's ops into a PerfDB first (lz workload + lz tune)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    root = Path(a.dir)
    make_model(root)
    prompt = [(i * 7919 + 13) % 32000 for i in range(a.prompt)]
    print(f"threads {a.threads}, prompt {a.prompt}, new {a.new}, rounds {a.rounds}; "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs")
    with_llama = llama_cpp_available()
    if with_llama:
        import llama_cpp
        print(f"llama.cpp: llama-cpp-python {llama_cpp.__version__}")
    else:
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
        lcpp = None
        if with_llama:
            gg = root / f"model-{dt}.gguf"
            write_gguf(root / dt, gg, dt)
            lcpp = LlamaCpp(gg, a.threads, a.prompt + a.new + 8)
            samples["llama.cpp"] = []
        for _ in range(a.rounds):
            samples["ours"].append(ours(a.lz, root / dt, prompt, a.new, a.threads, home))
            samples["hf"].append(hf.run(prompt, a.new))
            if lcpp is not None:
                samples["llama.cpp"].append(lcpp.run(prompt, a.new))
        del hf, lcpp
        med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in samples.items()}
        rows.append((dt, med))
    errors = {}
    for q in a.quant:
        src = root / "f32"
        flags = ("--weights", q)
        samples = {"ours": []}
        lcpp = None
        if with_llama:
            gg, ref = root / f"model-{q}.gguf", root / "model-f32.gguf"
            write_gguf(src, gg, "f32", q)
            write_gguf(src, ref, "f32")
            lcpp = LlamaCpp(gg, a.threads, a.prompt + a.new + 8)
            samples["llama.cpp"] = []
        for _ in range(a.rounds):
            samples["ours"].append(ours(a.lz, src, prompt, a.new, a.threads, home, flags))
            if lcpp is not None:
                samples["llama.cpp"].append(lcpp.run(prompt, a.new))
        want = ours_logits(a.lz, src, prompt, home)
        errors[(q, "ours")] = logits_error(ours_logits(a.lz, src, prompt, home, flags), want)
        if lcpp is not None:
            del lcpp
            got = LlamaCpp(gg, a.threads, a.prompt + 8, logits_all=True).all_logits(prompt)
            want = LlamaCpp(ref, a.threads, a.prompt + 8, logits_all=True).all_logits(prompt)
            errors[(q, "llama.cpp")] = logits_error(got, want)
        med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in samples.items()}
        rows.append((q, med))
    print(f"{'dtype':<6} {'engine':<14} {'prefill tok/s':>14} {'decode tok/s':>13}")
    for dt, med in rows:
        for k, (p, d) in med.items():
            print(f"{dt:<6} {k:<14} {p:>14.1f} {d:>13.1f}")
        op, od = med["ours"]
        for other in ("hf", "llama.cpp"):
            if other in med:
                p, d = med[other]
                print(f"{dt:<6} {'ours/' + other:<14} {op / p:>14.2f} {od / d:>13.2f}")
    if errors:
        print("logits error against the same engine's f32 model (at the prompt's last token; rel L2 mean over its positions):")
        print(f"{'format':<6} {'engine':<10} {'max|d|/max':>11} {'rel L2':>9} {'mean rel L2':>12}")
        for (q, engine), (mx, l2, mean) in errors.items():
            print(f"{q:<6} {engine:<10} {mx:>11.4f} {l2:>9.4f} {mean:>12.4f}")


if __name__ == "__main__":
    main()
