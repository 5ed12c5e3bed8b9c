"""Ops on torch tensors through LayerZero (see ops.py for the semantics of each)."""

from typing import Any, Optional, Sequence, Tuple, Union, overload

from ._lz import LayerZero

Tensor = Any  # torch.Tensor (torch is imported at run time, not required by these stubs)

def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    causal_align: str = "bottom_right",
    mask: Optional[Tensor] = None,
    scale: Optional[float] = None,
    window: Union[None, int, Tuple[int, int]] = None,
    softcap: Optional[float] = None,
    alibi_slopes: Optional[Tensor] = None,
    layout: str = "BSHD",
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    out: Optional[Tensor] = None,
    handle: Optional[LayerZero] = None,
) -> Tensor:
    """Scaled dot-product attention; q/k/v [B, S, H, D] (BSHD) or [B, H, S, D] (BHSD), GQA,
    causal bottom-right by default, varlen through cu_seqlens_q / cu_seqlens_k."""

def paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    context_lens: Tensor,
    *,
    causal: bool = True,
    scale: Optional[float] = None,
    window: Optional[int] = None,
    softcap: Optional[float] = None,
    k_scale: Optional[Tensor] = None,
    v_scale: Optional[Tensor] = None,
    kv_layout: str = "NHD",
    out: Optional[Tensor] = None,
    handle: Optional[LayerZero] = None,
) -> Tensor:
    """q [B, Sq, Hq, D] against NHD caches [pages, page_size, Hkv, D] through a block table."""

@overload
def rms_norm(
    x: Tensor, weight: Tensor, *, eps: float = 1e-6, residual: None = None, out: Optional[Tensor] = None,
    handle: Optional[LayerZero] = None,
) -> Tensor: ...
@overload
def rms_norm(
    x: Tensor, weight: Tensor, *, eps: float = 1e-6, residual: Tensor, out: Optional[Tensor] = None,
    handle: Optional[LayerZero] = None,
) -> Tuple[Tensor, Tensor]: ...
def layer_norm(
    x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, *, eps: float = 1e-5, out: Optional[Tensor] = None,
    handle: Optional[LayerZero] = None,
) -> Tensor: ...
@overload
def rope(
    q: Tensor, k: None = None, *, positions: Optional[Tensor] = None, cos: Optional[Tensor] = None,
    sin: Optional[Tensor] = None, style: str = "rotate_half", rotary_dim: Optional[int] = None,
    base: Optional[float] = None, handle: Optional[LayerZero] = None,
) -> Tensor: ...
@overload
def rope(
    q: Tensor, k: Tensor, *, positions: Optional[Tensor] = None, cos: Optional[Tensor] = None,
    sin: Optional[Tensor] = None, style: str = "rotate_half", rotary_dim: Optional[int] = None,
    base: Optional[float] = None, handle: Optional[LayerZero] = None,
) -> Tuple[Tensor, Tensor]: ...
def linear(
    x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, *, out: Optional[Tensor] = None,
    handle: Optional[LayerZero] = None,
) -> Tensor: ...
def swiglu(gate: Tensor, up: Optional[Tensor] = None, *, out: Optional[Tensor] = None, handle: Optional[LayerZero] = None) -> Tensor: ...
def mlp(
    x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor, *, activation: str = "silu",
    out: Optional[Tensor] = None, handle: Optional[LayerZero] = None,
) -> Tensor: ...
def embedding(ids: Tensor, table: Tensor, *, out: Optional[Tensor] = None, handle: Optional[LayerZero] = None) -> Tensor: ...
def sample(
    logits: Tensor, *, temperature: Optional[float] = None, top_k: Optional[int] = None, top_p: Optional[float] = None,
    min_p: Optional[float] = None, seed: Optional[int] = None, handle: Optional[LayerZero] = None,
) -> Tensor: ...
