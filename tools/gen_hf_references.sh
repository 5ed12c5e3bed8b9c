#!/usr/bin/env bash
# Regenerate the tiny HF test models and their transformers reference dumps in tests/models/.
# Run from the repository root:  bash tools/gen_hf_references.sh
# Needs tools/.venv (torch, transformers 5.24, safetensors, tokenizers; Pillow optional, for the ViT
# PIL-backend comparison). CPU only, ~1 minute.
set -euo pipefail
PY=${PY:-tools/.venv/bin/python}
M=tests/models
IDS10=1,17,42,99,3,250,7,128,64,5
IDS20=1,17,42,99,3,250,7,128,64,5,200,33,77,150,9,180,21,240,111,60

"$PY" tools/make_tiny_models.py --out "$M"
for name in llama-gqa llama-tied-llama3 llama-deep-linear llama-yarn qwen2 qwen3 mistral-swa mixtral qwen2-moe; do
    "$PY" tools/hf_reference.py --model "$M/$name" --prompt-ids "$IDS10" --max-new-tokens 32 \
        --dtype float64 --out "$M/$name/reference.safetensors"
done
"$PY" tools/hf_reference.py --model "$M/llama-dynamic" --prompt-ids "$IDS20" --max-new-tokens 32 \
    --dtype float64 --out "$M/llama-dynamic/reference.safetensors"
"$PY" tools/hf_reference.py --model "$M/llama-gqa-bf16" --prompt-ids "$IDS10" --max-new-tokens 32 \
    --dtype bfloat16 --out "$M/llama-gqa-bf16/reference.safetensors"
# The same bf16 weights computed in float64: the truth a bf16 engine is measured against.
"$PY" tools/hf_reference.py --model "$M/llama-gqa-bf16" --prompt-ids "$IDS10" --max-new-tokens 32 \
    --dtype float64 --out "$M/llama-gqa-bf16/reference_f64.safetensors"
"$PY" tools/hf_reference.py --model "$M/llama-gqa" --prompt "the kernel selector picks the fastest kernel" \
    --max-new-tokens 32 --dtype float64 --out "$M/llama-gqa/reference_text.safetensors"
# Encoder-decoder: one input plus a right-padded batch of two; greedy from decoder_start_token_id.
"$PY" tools/hf_reference_seq2seq.py --model "$M/bart" --input-ids 0,17,42,99,3,250,7,128,64,5,2 \
    --batch-ids 0,200,33,77,150,2 --max-new-tokens 16 --dtype float64 --out "$M/bart/reference.safetensors"
# The encoder at 128, 512 and 2048 positions (E2E 6.13): padded batches of two, 4 greedy steps.
"$PY" tools/hf_reference_seq2seq_long.py --model "$M/bart-long" --lengths 128,512,2048 --max-new-tokens 4 \
    --out "$M/bart-long/reference.safetensors"
# Vision: also writes $M/vit/image.ppm and $M/vit/image.safetensors.
"$PY" tools/hf_reference_vit.py --model "$M/vit" --dtype float64 --out "$M/vit/reference.safetensors"
du -ab "$M" | sort -k2
