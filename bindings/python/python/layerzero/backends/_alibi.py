"""The standard geometric ALiBi slopes (the form LayerZero's ``alibi`` attribute means)."""

import math


def slopes(heads):
    def pow2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * (start**i) for i in range(n)]

    if math.log2(heads).is_integer():
        return pow2(heads)
    closest = 2 ** math.floor(math.log2(heads))
    return pow2(closest) + pow2(2 * closest)[0::2][: heads - closest]


def tensor(heads, device):
    import torch

    return torch.tensor(slopes(heads), dtype=torch.float32, device=device)
