#!/usr/bin/env python3
"""Build the tiny random-weight Hugging Face test models under tests/models/.

Run from the repository root:

    tools/.venv/bin/python tools/make_tiny_models.py [--out tests/models]

Everything is built locally from configs (no hub access) and is deterministic: every model
draws its weights from its own seeded torch.Generator, in the order of
`model.named_parameters()`, so the result does not depend on transformers' own init code:

* Linear / embedding weights: normal(0, STD) with STD = 0.1 (hidden size 64, so projections
  keep activations around unit scale and attention is not uniform);
* biases (Qwen2 q/k/v): normal(0, 0.1), i.e. nonzero;
* every RMSNorm weight (input/post-attention/final norms, Qwen3 q_norm/k_norm):
  1 + 0.1 * normal(0, 1), so the norm scales are exercised.

Models (see tests/models/README.md for what each exercises):
    llama-gqa, llama-tied-llama3, llama-deep-linear, llama-yarn, llama-dynamic,
    qwen2, qwen3, mistral-swa, llama-gqa-bf16

Note that transformers 5.x writes RoPE settings to config.json as `rope_parameters`
(with `rope_theta` inside it), not as the older `rope_scaling` + top-level `rope_theta`.

llama-gqa and llama-gqa-bf16 also get a `tokenizer.json`: a byte-level BPE trained with
the `tokenizers` library on the small corpus below (193 entries, limit 256), including the
special tokens <unk> (id 0), <s> (id 1), </s> (id 2). Its alphabet is only the bytes
that occur in the corpus (a full byte alphabet alone would be 256 entries), so bytes that
never occur there encode to <unk>. Its post-processor prepends <s> (BOS) to every
encoded sequence.
"""

import argparse
import json
import os
import shutil

import torch

torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

STD = 0.1
NORM_JITTER = 0.1
BIAS_STD = 0.1

COMMON = dict(
    hidden_size=64,
    num_attention_heads=4,
    intermediate_size=128,
    vocab_size=256,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    initializer_range=0.05,
    bos_token_id=1,
    eos_token_id=2,
    hidden_act="silu",
)

CORPUS = [
    "The kernel selector picks the fastest kernel for every operation in the model. "
    "It looks at the shapes, the data types and the device, then it reads the dispatch "
    "table and chooses the kernel that the benchmarks said was the best one.",
    "A transformer layer has an attention block and a feed forward block. The attention "
    "block projects the hidden state into queries, keys and values, rotates the queries "
    "and the keys with rotary position embeddings, and then mixes the values with the "
    "softmax of the scaled scores.",
    "When the cache is warm the decoder reads the old keys and values instead of "
    "computing them again. Each new token only needs one row of queries, so the decode "
    "step is small and fast, while the prefill step processes the whole prompt at once.",
    "Grouped query attention shares each key and value head between several query heads. "
    "This saves memory in the cache and makes long prompts cheaper to serve.",
    "The runtime checks every candidate kernel against the reference, records the reason "
    "when a kernel is rejected, and falls back to a slower but simpler kernel when no fast "
    "one fits. Tests compare the outputs layer by layer so that a wrong kernel is found "
    "early, before it can change the generated text.",
    "Small models with random weights are enough for these tests: they are quick to load, "
    "they run on any machine, and their numbers are fixed by the seed.",
]

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]


def init_weights(model, seed):
    """Deterministically overwrite every parameter (see the module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            short = name.split(".")[-2] if "." in name else name
            if "norm" in short:
                p.copy_(1.0 + NORM_JITTER * torch.randn(p.shape, generator=gen, dtype=torch.float32))
            elif name.endswith(".bias"):
                p.copy_(BIAS_STD * torch.randn(p.shape, generator=gen, dtype=torch.float32))
            else:
                p.copy_(STD * torch.randn(p.shape, generator=gen, dtype=torch.float32))
    return model


def build_tokenizer():
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=[],
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A",
        pair="<s> $A <s> $B",
        special_tokens=[("<s>", bos_id)],
    )
    assert tok.get_vocab_size() <= 256, tok.get_vocab_size()
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    return tok


def model_specs():
    """(name, model class, config, seed)."""
    specs = []
    specs.append((
        "llama-gqa", LlamaForCausalLM,
        LlamaConfig(**COMMON, num_hidden_layers=2, num_key_value_heads=2,
                    tie_word_embeddings=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        1001,
    ))
    specs.append((
        "llama-tied-llama3", LlamaForCausalLM,
        LlamaConfig(**COMMON, num_hidden_layers=3, num_key_value_heads=4,
                    tie_word_embeddings=True,
                    rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 64}),
        1002,
    ))
    deep = dict(COMMON)
    # 8 layers at intermediate 128 would be ~1.1 MB; a narrower MLP keeps the folder small.
    deep["intermediate_size"] = 32
    specs.append((
        "llama-deep-linear", LlamaForCausalLM,
        LlamaConfig(**deep, num_hidden_layers=8, num_key_value_heads=1,
                    tie_word_embeddings=False,
                    rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
        1003,
    ))
    specs.append((
        "llama-yarn", LlamaForCausalLM,
        LlamaConfig(**COMMON, num_hidden_layers=2, num_key_value_heads=2,
                    tie_word_embeddings=False,
                    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                     "original_max_position_embeddings": 64}),
        1004,
    ))
    dyn = dict(COMMON)
    dyn["max_position_embeddings"] = 16
    specs.append((
        "llama-dynamic", LlamaForCausalLM,
        LlamaConfig(**dyn, num_hidden_layers=2, num_key_value_heads=2,
                    tie_word_embeddings=False,
                    rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
        1005,
    ))
    specs.append((
        "qwen2", Qwen2ForCausalLM,
        Qwen2Config(**COMMON, num_hidden_layers=2, num_key_value_heads=2,
                    tie_word_embeddings=True, use_sliding_window=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        1006,
    ))
    specs.append((
        "qwen3", Qwen3ForCausalLM,
        Qwen3Config(**COMMON, num_hidden_layers=2, num_key_value_heads=2, head_dim=32,
                    tie_word_embeddings=False, use_sliding_window=False, attention_bias=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        1007,
    ))
    specs.append((
        "mistral-swa", MistralForCausalLM,
        MistralConfig(**COMMON, num_hidden_layers=2, num_key_value_heads=2, sliding_window=4,
                      tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        1008,
    ))
    return specs


def dir_size(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "models"))
    args = ap.parse_args()
    out_root = os.path.normpath(args.out)
    os.makedirs(out_root, exist_ok=True)

    tokenizer = build_tokenizer()
    total = 0
    for name, cls, config, seed in model_specs():
        torch.manual_seed(seed)  # for anything HF itself draws at construction
        model = cls(config).to(torch.float32)
        init_weights(model, seed)
        if config.tie_word_embeddings:
            assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        model.eval()
        out = os.path.join(out_root, name)
        # Remove only the files this script writes, so a reference.safetensors survives.
        os.makedirs(out, exist_ok=True)
        for f in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
            if os.path.exists(os.path.join(out, f)):
                os.remove(os.path.join(out, f))
        model.save_pretrained(out, safe_serialization=True)
        if name == "llama-gqa":
            tokenizer.save(os.path.join(out, "tokenizer.json"))
            # Same weights in bfloat16.
            bf_out = os.path.join(out_root, "llama-gqa-bf16")
            os.makedirs(bf_out, exist_ok=True)
            for f in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
                if os.path.exists(os.path.join(bf_out, f)):
                    os.remove(os.path.join(bf_out, f))
            model.to(torch.bfloat16).save_pretrained(bf_out, safe_serialization=True)
            shutil.copy(os.path.join(out, "tokenizer.json"), os.path.join(bf_out, "tokenizer.json"))
            with open(os.path.join(bf_out, "config.json")) as fh:
                cfg = json.load(fh)
            dtype = cfg.get("dtype", cfg.get("torch_dtype"))
            assert dtype == "bfloat16", dtype
    for name in [s[0] for s in model_specs()] + ["llama-gqa-bf16"]:
        path = os.path.join(out_root, name)
        size = dir_size(path)
        total += size
        print(f"{name:20s} {size / 1024:8.1f} KiB  ({', '.join(sorted(os.listdir(path)))})")
    print(f"{'total':20s} {total / 1024:8.1f} KiB")


if __name__ == "__main__":
    main()
