#!/usr/bin/env python3
"""Dump a layer-by-layer Hugging Face transformers reference for a tiny ViT image classifier.

Run from the repository root:

    tools/.venv/bin/python tools/hf_reference_vit.py --model tests/models/vit \\
        [--dtype float64|float32] --out tests/models/vit/reference.safetensors [--check]

The test image (written next to the reference, into the model folder):
* `image.ppm`: binary PPM (P6), 32x32, maxval 255, RGB bytes row by row: a deterministic u8
  image (gradients, an 8-pixel checkerboard in blue and seeded noise; pixel (0,0) is black and
  (31,31) white so the range ends are exercised);
* `image.safetensors`: `pixel_values` float32 [1, 3, 32, 32] (channels first, RGB), exactly
  what transformers' default ViTImageProcessor (torchvision backend) makes of those bytes with
  the model's `preprocessor_config.json` (size 32x32, so the bilinear resize is a no-op):
  rescale 1/255 fused with normalize mean 0.5, std 0.5
  (image_processing_backends.py:329-371: mean and std are multiplied by 1/rescale_factor = 255,
  then torchvision's normalize computes (x - 127.5) / 127.5 in float32) =
  float32((u8 - 127.5) / 127.5), which is also the correctly rounded u8 / 127.5 - 1.
  The PIL backend (ViTImageProcessorPil; image_transforms.py:121-125 rescales in float64 and
  casts to float32, then normalizes (x - 0.5) / 0.5 in float32) differs by one float32 ulp
  (<= 6e-8) for half of the 256 byte values; this script reports that difference when Pillow
  is installed. The class default size is 224x224, so a processor built without the model's
  preprocessor_config.json would resize this image.

The model is loaded with `attn_implementation="eager"` in the compute dtype (default
float64); its eager softmax still runs in float32 (models/vit/modeling_vit.py:183), LayerNorm
(eps 1e-12 from config.json) and GELU (exact erf) in the compute dtype.

Output tensors (float32; batch dropped; P = 16 patches, T = P + 1 tokens, CLS first):
* `patch_embed` [P, H]: the patch projection (Conv2d kernel = stride = 8) before the CLS token
  and the position embeddings; patch p = row * 4 + col of the 4x4 patch grid (row-major, from
  the top-left), i.e. `projection(pixel_values).flatten(2).transpose(1, 2)`
  (modeling_vit.py:69); the conv weight [H, 3, 8, 8] flattens as c*64 + ky*8 + kx.
* `hidden.{i}` [T, H], i = 0..=L: 0 = cat(cls_token, patch_embed) + position_embeddings
  (modeling_vit.py:146-157), i = output of layer i-1. ViTModel captures with
  `tie_last_hidden_states=False` (modeling_vit.py:353), so `hidden.{L}` is BEFORE the final
  LayerNorm (unlike the causal-LM references).
* per layer l (pre-LayerNorm block, modeling_vit.py:273-286):
  `layer.{l}.attn_norm`  layernorm_before output
  `layer.{l}.attn_out`   attention output before o_proj (heads concatenated, column h*16 + d)
  `layer.{l}.o_proj`     o_proj output (`attention.output.dense` in the checkpoint)
  `layer.{l}.post_attn`  layer input + o_proj
  `layer.{l}.ffn_norm`   layernorm_after output
  `layer.{l}.ffn_out`    fc2(gelu(fc1(ffn_norm))) (`intermediate.dense` / `output.dense`)
  `layer.{l}.out`        post_attn + ffn_out
* `final_norm` [T, H]: `vit.layernorm` output; `pooled` [1, H]: its CLS row (what
  ViTForImageClassification classifies, modeling_vit.py:544-546; no pooler layer);
  `logits` [1, num_labels].
* `pixel_values` [3, 32, 32] (the same as image.safetensors, batch dropped).

Sanity checks (assertions): residual identities; layer.{l}.out == hidden.{l+1}; hidden.0 ==
cat(cls, patch_embed) + pos; an independent float64 implementation from the checkpoint's hub
tensors (patches cut with unfold and multiplied by the flattened conv weight, pre-LN
blocks, float64 softmax) reproduces patch_embed, every hidden state, pooled and logits within
5e-6 (the float32 softmax is the only float32 step); the PPM read back equals the u8 image;
pixel_values equals the formula above exactly.
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
from transformers import AutoModelForImageClassification  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_reference import stabilize_header, to_f32  # noqa: E402

DTYPES = {"float32": torch.float32, "float64": torch.float64}
IMAGE_SEED = 4242
SIZE = 32


def make_image():
    """Deterministic u8 image, [32, 32, 3] (HWC, RGB)."""
    gen = torch.Generator().manual_seed(IMAGE_SEED)
    noise = torch.randint(0, 48, (SIZE, SIZE, 3), generator=gen)
    yy, xx = torch.meshgrid(torch.arange(SIZE), torch.arange(SIZE), indexing="ij")
    checker = 96 * (((xx // 8) + (yy // 8)) % 2)
    img = torch.stack([xx * 7 + noise[..., 0], yy * 7 + noise[..., 1], (xx + yy) * 3 + checker + noise[..., 2]], -1)
    img = (img % 256).to(torch.uint8)
    img[0, 0] = 0
    img[SIZE - 1, SIZE - 1] = 255
    return img


def write_ppm(path, img):
    h, w, c = img.shape
    assert c == 3
    with open(path, "wb") as fh:
        fh.write(f"P6\n{w} {h}\n255\n".encode("ascii"))
        fh.write(bytes(img.contiguous().view(-1).tolist()))


def read_ppm(path):
    data = open(path, "rb").read()
    fields = []
    pos = 0
    while len(fields) < 4:
        while data[pos:pos + 1].isspace():
            pos += 1
        start = pos
        while not data[pos:pos + 1].isspace():
            pos += 1
        fields.append(data[start:pos].decode("ascii"))
    pos += 1  # the single whitespace byte after maxval
    assert fields[0] == "P6" and fields[3] == "255", fields
    w, h = int(fields[1]), int(fields[2])
    raw = data[pos:]
    assert len(raw) == w * h * 3
    return torch.tensor(list(raw), dtype=torch.uint8).view(h, w, 3)


def pixel_values_of(img):
    """float32 [1, 3, H, W]: the torchvision backend's fused rescale + normalize."""
    x = img.permute(2, 0, 1).to(torch.float32)
    return ((x - 127.5) / 127.5)[None]


def pil_backend_pixels(model_dir, img):
    """ViTImageProcessorPil on the image (None when Pillow is missing)."""
    try:
        import PIL  # noqa: F401
        from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil
    except ImportError:
        return None
    proc = ViTImageProcessorPil.from_pretrained(model_dir)
    return torch.from_numpy(proc(images=img.numpy(), return_tensors="np")["pixel_values"])


class Recorder:
    def __init__(self, model):
        self.on = False
        self.store = {}
        self.handles = []
        vit = model.vit
        self.handles.append(vit.embeddings.patch_embeddings.register_forward_hook(self._out("patch_embed")))
        self.handles.append(vit.layernorm.register_forward_hook(self._out("final_norm")))
        for l, layer in enumerate(vit.layers):
            attn = layer.attention
            self.handles += [
                layer.layernorm_before.register_forward_hook(self._out(f"layer.{l}.attn_norm")),
                attn.o_proj.register_forward_pre_hook(self._in(f"layer.{l}.attn_out")),
                attn.o_proj.register_forward_hook(self._out(f"layer.{l}.o_proj")),
                layer.layernorm_after.register_forward_pre_hook(self._in(f"layer.{l}.post_attn")),
                layer.layernorm_after.register_forward_hook(self._out(f"layer.{l}.ffn_norm")),
                layer.mlp.register_forward_hook(self._out(f"layer.{l}.ffn_out")),
                layer.register_forward_hook(self._out(f"layer.{l}.out")),
            ]

    def _put(self, key, t):
        assert key not in self.store, f"{key} recorded twice"
        assert t.shape[0] == 1
        self.store[key] = t[0].detach().clone()

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

    def close(self):
        for h in self.handles:
            h.remove()


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def independent_vit(path, cfg, pixel_values):
    """ViT forward in float64 from the checkpoint's hub tensors; returns a dict of stages."""
    w = {k: v.double() for k, v in load_file(path).items()}
    eps = cfg.layer_norm_eps
    p = cfg.patch_size
    hdim = cfg.hidden_size
    nh = cfg.num_attention_heads
    d = hdim // nh
    x = pixel_values.double()[0]  # [3, 32, 32]
    c, hh, ww = x.shape
    gh, gw = hh // p, ww // p
    # [3, gh, p, gw, p] -> [gh, gw, 3, p, p] -> [P, 3*p*p], patch p = row*gw + col, feature c*p*p + ky*p + kx
    patches = x.view(c, gh, p, gw, p).permute(1, 3, 0, 2, 4).reshape(gh * gw, c * p * p)
    conv_w = w["vit.embeddings.patch_embeddings.projection.weight"].reshape(hdim, -1)
    patch_embed = patches @ conv_w.T + w["vit.embeddings.patch_embeddings.projection.bias"]
    h = torch.cat([w["vit.embeddings.cls_token"][0], patch_embed], 0) + w["vit.embeddings.position_embeddings"][0]
    out = {"patch_embed": patch_embed, "hidden.0": h}

    def lin(t, name):
        return t @ w[name + ".weight"].T + w[name + ".bias"]

    for l in range(cfg.num_hidden_layers):
        pre = f"vit.encoder.layer.{l}"
        a = layer_norm(h, w[pre + ".layernorm_before.weight"], w[pre + ".layernorm_before.bias"], eps)
        q = lin(a, pre + ".attention.attention.query").view(-1, nh, d).transpose(0, 1)
        k = lin(a, pre + ".attention.attention.key").view(-1, nh, d).transpose(0, 1)
        v = lin(a, pre + ".attention.attention.value").view(-1, nh, d).transpose(0, 1)
        att = torch.softmax((q @ k.transpose(1, 2)) * d ** -0.5, dim=-1) @ v
        att = att.transpose(0, 1).reshape(-1, hdim)
        h = h + lin(att, pre + ".attention.output.dense")
        f = layer_norm(h, w[pre + ".layernorm_after.weight"], w[pre + ".layernorm_after.bias"], eps)
        f = lin(f, pre + ".intermediate.dense")
        f = 0.5 * f * (1.0 + torch.erf(f / math.sqrt(2.0)))
        h = h + lin(f, pre + ".output.dense")
        out[f"layer.{l}.attn_out"] = att
        out[f"hidden.{l + 1}"] = h
    final = layer_norm(h, w["vit.layernorm.weight"], w["vit.layernorm.bias"], eps)
    out["final_norm"] = final
    out["pooled"] = final[:1]
    out["logits"] = lin(final[:1], "classifier")
    return out


def close(a, b, what, tol):
    a = a.double()
    b = b.double()
    scale = max(1.0, b.abs().max().item())
    err = (a - b).abs().max().item()
    assert err <= tol * scale, f"{what}: max abs diff {err:.3e}"
    return err


def check_file(path):
    t = load_file(path)
    with safetensors.safe_open(path, "pt") as f:
        meta = f.metadata() or {}
    print(f"{path}: {len(t)} tensors, {os.path.getsize(path) / 1024:.1f} KiB")
    for k in ("transformers", "torch", "compute_dtype", "model", "image", "predicted_label"):
        print(f"  {k}: {meta.get(k)}")
    for k in sorted(t):
        if not k.startswith("layer.1."):
            print(f"  {k}: {tuple(t[k].shape)} {t[k].dtype} absmax {t[k].abs().max().item():.4g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float64")
    ap.add_argument("--out", required=True)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    dtype = DTYPES[args.dtype]

    # The image, next to the model.
    img = make_image()
    ppm = os.path.join(args.model, "image.ppm")
    write_ppm(ppm, img)
    assert torch.equal(read_ppm(ppm), img)
    pixel_values = pixel_values_of(img)
    # x - 127.5 is exact in float32, so one rounding: the correctly rounded u8 / 127.5 - 1.
    exact = (img.permute(2, 0, 1).double() / 127.5 - 1.0).float()[None]
    assert torch.equal(pixel_values, exact)
    save_file({"pixel_values": pixel_values.contiguous()}, os.path.join(args.model, "image.safetensors"),
              metadata={"source": "image.ppm", "layout": "[1, 3, 32, 32] RGB channels first",
                        "formula": "float32((u8 - 127.5) / 127.5) = ViTImageProcessor rescale 1/255 + "
                                   "normalize mean 0.5 std 0.5 (torchvision backend, fused)"})
    stabilize_header(os.path.join(args.model, "image.safetensors"))
    report = {}
    pil = pil_backend_pixels(args.model, img)
    if pil is None:
        print("  Pillow not installed: PIL-backend comparison skipped")
    else:
        assert tuple(pil.shape) == (1, 3, SIZE, SIZE), tuple(pil.shape)
        diff = (pil - pixel_values).abs()
        report["pil_backend_maxdiff"] = diff.max().item()
        report["pil_backend_differing_values"] = int((diff > 0).sum())
        print(f"  ViTImageProcessorPil vs torchvision-backend formula: max diff {diff.max().item():.3e} "
              f"({int((diff > 0).sum())} of {diff.numel()} values differ)")
        assert diff.max().item() <= 6e-8

    model = AutoModelForImageClassification.from_pretrained(args.model, dtype=dtype, attn_implementation="eager")
    model.eval()
    assert type(model).__name__ == "ViTForImageClassification"
    cfg = model.config
    L = cfg.num_hidden_layers
    rec = Recorder(model)
    try:
        with torch.no_grad():
            rec.on = True
            out = model(pixel_values=pixel_values.to(dtype), output_hidden_states=True)
            rec.on = False
    finally:
        rec.close()
    t = dict(rec.store)
    for i, h in enumerate(out.hidden_states):
        t[f"hidden.{i}"] = h[0]
    t["pooled"] = t["final_norm"][:1]
    t["logits"] = out.logits
    assert len(out.hidden_states) == L + 1

    n_tok = (SIZE // cfg.patch_size) ** 2 + 1
    tol = {torch.float64: 1e-9, torch.float32: 1e-5}[dtype]
    cross_tol = {torch.float64: 5e-6, torch.float32: 1e-4}[dtype]
    with torch.no_grad():
        assert tuple(t["patch_embed"].shape) == (n_tok - 1, cfg.hidden_size)
        emb = model.vit.embeddings
        close(torch.cat([emb.cls_token[0], t["patch_embed"]], 0) + emb.position_embeddings[0], t["hidden.0"],
              "hidden.0 = cat(cls, patch_embed) + pos", tol)
        for l in range(L):
            for name in ("attn_norm", "o_proj", "post_attn", "ffn_norm", "ffn_out", "out", "attn_out"):
                assert tuple(t[f"layer.{l}.{name}"].shape) == (n_tok, cfg.hidden_size), name
            close(t[f"hidden.{l}"] + t[f"layer.{l}.o_proj"], t[f"layer.{l}.post_attn"], f"layer.{l}.post_attn", tol)
            close(t[f"layer.{l}.post_attn"] + t[f"layer.{l}.ffn_out"], t[f"layer.{l}.out"], f"layer.{l}.out", tol)
            close(t[f"layer.{l}.out"], t[f"hidden.{l + 1}"], f"layer.{l}.out vs hidden.{l + 1}", tol)
        close(model.vit.layernorm(t[f"hidden.{L}"]), t["final_norm"], "final_norm(hidden.L)", tol)
        close(model.classifier(t["pooled"]), t["logits"], "classifier(pooled)", tol)

    ind = independent_vit(os.path.join(args.model, "model.safetensors"), cfg, pixel_values)
    worst = 0.0
    for k, v in ind.items():
        worst = max(worst, close(v, t[k], f"independent {k}", cross_tol))
    report["independent_maxdiff"] = worst
    print(f"  independent float64 ViT from the hub tensors: max diff {worst:.3e}")

    t["pixel_values"] = pixel_values[0]
    t = to_f32(t)
    pred = int(t["logits"][0].argmax())
    meta = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "compute_dtype": str(dtype).replace("torch.", ""),
        "model": os.path.basename(os.path.normpath(args.model)),
        "architecture": type(model).__name__,
        "image": f"image.ppm / image.safetensors (seed {IMAGE_SEED})",
        "attn_implementation": "eager",
        "hidden_convention": "hidden.0=cat(cls, patch_embed)+pos, hidden.i=output of layer i-1, "
                             "hidden.L=before the final layernorm (final_norm)",
        "predicted_label": str(pred),
        "sanity": json.dumps(report, sort_keys=True),
    }
    save_file(t, args.out, metadata=meta)
    stabilize_header(args.out)
    print(f"  wrote {args.out} ({os.path.getsize(args.out) / 1024:.1f} KiB); logits {t['logits'][0].tolist()}")
    if args.check:
        check_file(args.out)


if __name__ == "__main__":
    main()
