"""The 4-bit weight formats of LayerZero's `linear_int4`, built from their public definitions
(used by gen_fixtures.py; no LayerZero code is read here).

- NF4 (bitsandbytes / QLoRA, Dettmers et al. 2023): 16 values, absmax per block of K elements
  (64 by default) in float32; a code is the index of the nearest value to w / absmax. Packing
  as bitsandbytes' kQuantizeBlockwise: the FIRST element of a pair in the HIGH nibble.
- MXFP4 (OCP Microscaling Formats v1.0): FP4 E2M1 elements in blocks of 32, one E8M0 shared
  exponent per block, X = 2^(floor(log2(amax)) - emax_elem) with emax_elem = 2 for E2M1;
  the element is w / X rounded to the nearest E2M1 value, saturating at +-6.
- NVFP4 (NVIDIA): E2M1 elements in blocks of 16, one FP8 E4M3 scale per block and one float32
  scale per tensor: global = amax(w) / (448 * 6), block scale = e4m3(amax_block / 6 / global),
  w = e2m1 * block scale * global.
MXFP4 and NVFP4 put the even element in the LOW nibble.
"""

import torch

F64 = torch.float64
F32 = torch.float32

# bitsandbytes csrc/kernels.cu, the NF4 lookup table (float32).
NF4 = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
], dtype=F32)


def e2m1_table():
    """E2M1 by code: bit 3 sign, 2 exponent bits (bias 1), 1 mantissa bit; no inf/NaN."""
    vals = []
    for code in range(8):
        e, m = code >> 1, code & 1
        vals.append(m * 0.5 if e == 0 else 2.0 ** (e - 1) * (1 + m * 0.5))
    pos = torch.tensor(vals, dtype=F32)
    return torch.cat([pos, -pos])


E2M1 = e2m1_table()


def nearest(v, table):
    """The code of the nearest table value to each element of v (float64)."""
    return (v[..., None] - table.to(F64)).abs().argmin(-1)


def blocks(w, block):
    """[N, K] -> [N, K / block, block]."""
    n, k = w.shape
    return w.reshape(n, k // block, block)


def pack(q, high_first):
    """Codes [N, K] (0..15) -> int8 bytes [N, K / 2]."""
    even, odd = q[:, 0::2], q[:, 1::2]
    byte = (even << 4) | odd if high_first else even | (odd << 4)
    return byte.to(torch.uint8).view(torch.int8)


def quantize(fmt, w, block):
    """w float64 [N, K] -> (codes [N, K], stored tensors {scales, global_scale?}, per-element
    float64 scale [N, K] the codes multiply)."""
    b = blocks(w, block)
    amax = b.abs().amax(-1)
    if fmt == "nf4":
        absmax = amax.to(F32)
        s64 = absmax.to(F64)
        q = nearest(b / s64[..., None], NF4)
        stored = {"scales": absmax}
    elif fmt == "mxfp4":
        e = torch.floor(torch.log2(amax)) - 2
        byte = (e + 127).clamp(0, 254)
        s64 = torch.exp2(byte - 127)
        q = nearest((b / s64[..., None]).clamp(-6, 6), E2M1)
        stored = {"scales": byte.to(torch.uint8).view(torch.int8)}
    elif fmt == "nvfp4":
        glob = (w.abs().max() / (448 * 6)).to(F32)
        sb = (amax / 6 / glob.to(F64)).to(torch.float8_e4m3fn)
        s64 = sb.to(F64) * glob.to(F64)
        q = nearest((b / s64[..., None]).clamp(-6, 6), E2M1)
        stored = {"scales": sb, "global_scale": glob.reshape(1)}
    else:
        raise ValueError(fmt)
    n, k = w.shape
    return q.reshape(n, k), stored, s64.repeat_interleave(block, 1)


def table(fmt):
    return NF4 if fmt == "nf4" else E2M1


def dequantize64(fmt, q, scale64):
    """The weight in float64: code value times its scale."""
    return table(fmt).to(F64)[q] * scale64


def dequantize32(fmt, q, stored, block):
    """The weight as a float32 kernel forms it: code * (scale [* global]), in float32."""
    s = stored["scales"]
    if fmt == "mxfp4":
        s32 = torch.exp2(s.view(torch.uint8).to(F32) - 127)
    elif fmt == "nvfp4":
        s32 = s.to(F32) * stored["global_scale"]
    else:
        s32 = s.to(F32)
    return table(fmt)[q] * s32.repeat_interleave(block, 1)
