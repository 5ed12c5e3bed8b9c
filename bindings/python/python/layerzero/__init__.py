"""LayerZero: which kernel runs each op of an ML model, and why.

It knows what every kernel of every backend can do (FlashAttention 2/3, FlashInfer, xFormers,
PyTorch SDPA, Liger, oneDNN, ZenDNN, its own CPU kernels), selects the fastest valid one for a
call on this machine, and explains every verdict with stable reason codes::

    import torch
    import layerzero as lz

    q = torch.randn(1, 128, 8, 64)           # [batch, seq, heads, head_dim]
    k = v = torch.randn(1, 128, 2, 64)       # GQA: 2 KV heads
    print(lz.select("attention", q=q, k=k, v=v, causal=True).kernel)
    report = lz.explain("attention", q=q, k=k, v=v, causal=True, dropout_p=0.1)
    for c in report.candidates:
        print(c.kernel, c.verdict, [r.code for r in c.reasons])

Tensors are read through their metadata (dtype, shape, strides, device): nothing is copied
and torch is not required to import this package. Every error is a ``LayerZeroError``.
"""

import enum as _enum

from . import _lz
from ._lz import (
    Candidate,
    InvalidInputError,
    IoError,
    KernelFailedError,
    LayerZero,
    LayerZeroError,
    LockViolationError,
    NoKernelError,
    Reason,
    Report,
    SchemaError,
    Selection,
    UnknownHardwareError,
    counters,
    doctor,
    explain,
    host,
    readiness_check,
    select,
    version,
    which,
)

from . import ops  # noqa: E402

__version__ = version()

ReasonCode = _enum.Enum("ReasonCode", [(name, name) for name, _ in _lz.reason_codes()], module=__name__)
ReasonCode.__doc__ = "The closed vocabulary of verdicts: a stable name per reason a kernel is refused."

__all__ = [
    "Candidate",
    "InvalidInputError",
    "IoError",
    "KernelFailedError",
    "LayerZero",
    "LayerZeroError",
    "LockViolationError",
    "NoKernelError",
    "Reason",
    "ReasonCode",
    "Report",
    "SchemaError",
    "Selection",
    "UnknownHardwareError",
    "counters",
    "doctor",
    "explain",
    "host",
    "readiness_check",
    "select",
    "version",
    "which",
]
