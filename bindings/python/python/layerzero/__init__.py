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

import atexit as _atexit
import contextlib as _contextlib
import enum as _enum
import os as _os
import sys as _sys

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
    PlanMismatchError,
    Reason,
    Report,
    SchemaError,
    Selection,
    UnknownHardwareError,
    version,
)
from . import backends as _backends


def _ready():
    """Registers the Python backends (once): every call into the runtime goes through here."""
    if not _backends._installed:
        _backends.install()


def select(op, **kwargs):
    """The kernel ``op`` gets on this machine for these tensors and attributes (a
    ``Selection``); ``NoKernelError`` with every candidate's reasons when none qualifies."""
    _ready()
    return _lz.select(op, **kwargs)


def explain(op, **kwargs):
    """Every candidate's verdict for ``op`` on this machine (a ``Report``)."""
    _ready()
    return _lz.explain(op, **kwargs)


def which(op, **kwargs):
    """The id of the kernel ``op`` gets on this machine."""
    _ready()
    return _lz.which(op, **kwargs)


def counters():
    """The process handle's counters: plan and cache hits and misses, live selections,
    fallbacks, kernel failures."""
    _ready()
    return _lz.counters()


def host():
    """The process-wide handle (``LayerZero``), with the Python backends registered."""
    _ready()
    return _lz.host()


def readiness_check(*, group=None, handle=None, **kwargs):
    """The checks of ``lz readiness-check`` (capabilities, files, policy, table, PerfDB), each a
    dict with ``name``, ``ok``, ``detail`` and ``fix``. With ``group`` (a torch.distributed
    group, or ``True`` for the world), a ``distributed`` check too: whether every rank would
    serve the same kernels (``layerzero.distributed.agree`` with ``handle`` and the
    ``workload`` given); every rank of the group must call it."""
    checks = _lz.readiness_check(**kwargs)
    if group is not None and group is not False:
        from . import distributed

        workload = kwargs.get("workload")
        try:
            distributed.agree(handle, None if group is True else group, workload)
            g = distributed.Group(None if group is True else group)
            checks.append(
                {"name": "distributed", "ok": True, "detail": f"the {g.size()} ranks agree", "fix": None}
            )
        except PlanMismatchError as e:
            checks.append(
                {
                    "name": "distributed",
                    "ok": False,
                    "detail": str(e),
                    "fix": "give every rank the same policy, table, capabilities and libraries "
                    "(layerzero.distributed.solve shares the root's plan)",
                }
            )
    return checks


def doctor():
    """This machine examined, as ``lz doctor --json`` reports it, plus the Python backends:
    each library with its version or import error, and each Python executor, verified or not
    (``selftest()`` verifies)."""
    _ready()
    report = _lz.doctor()
    report["python_backends"] = {
        name: dict(info) for name, info in sorted(_backends.BACKENDS.items())
    }
    report["python_executors"] = {
        kernel: {"backend": backend, "version": version, "verification": _backends.verification(kernel)}
        for kernel, (backend, _, version) in sorted(_backends.EXECUTORS.items())
    }
    return report


def tune(workload, *, budget=None, perfdb=None, verify=True, refresh=False, calibrate=None, hardware=None):
    """Measures every eligible kernel with an executor (the Python ones: torch SDPA, Liger,
    ZenDNN, ..., with LayerZero's own) at every bucket of ``workload`` (a workload file) on
    this machine, by the protocol of ``lz tune``, into the PerfDB (``perfdb``, default
    ``$LAYERZERO_PERFDB``); ``budget`` seconds stops new measurements. Buckets on a GPU get
    their inputs made there by torch, and each timed call is waited for. With ``verify``,
    every kernel is re-timed and the report gives the regret of model-only and PerfDB-backed
    selection; with ``calibrate`` (a path), the cost model is fitted to the times and the
    calibration written there (``lz tune --calibrate``). With ``hardware`` (a named profile
    such as ``"h100"``, or a profile file), the model-only ranking and the calibration are
    those of that profile, held against this machine's times: how far the profile's figures
    are from this machine (its rows in the PerfDB carry that profile's fingerprint). Returns
    ``lz tune --json``'s report as a dict."""
    _ready()
    perfdb = None if perfdb is None else str(perfdb)
    calibrate = None if calibrate is None else str(calibrate)
    return _lz.tune(
        str(workload),
        perfdb=perfdb,
        budget=budget,
        verify=verify,
        refresh=refresh,
        calibrate=calibrate,
        hardware=hardware,
    )


def solve(workload, out, *, perfdb=None):
    """Bakes a dispatch table for ``workload`` at ``out``, scored with the PerfDB's
    measurements of this machine (``lz solve`` for the Python host: its Python executors can
    serve the winners). Serve it with ``LayerZero.host().with_plan(out)``. Returns
    ``(entries, unsolved)``."""
    _ready()
    return _lz.solve(str(workload), str(out), perfdb=None if perfdb is None else str(perfdb))


_graph_strict = None


def workload(model, out=None, *, tp=1, dtype=None, max_batch=8, max_seq=None, page_size=16):
    """The workload one rank serves of the Hugging Face model folder ``model``: every op its
    forward pass dispatches, with perf-axis ranges for ``max_batch`` sequences of up to
    ``max_seq`` positions (default: the config's), split for ``tp`` tensor-parallel ranks
    (heads / tp; KV heads / tp, replicated when fewer than tp; MLP width / tp), as ``lz
    workload --model DIR --tp N`` writes it. Written to ``out`` when given; returned as a
    dict."""
    import json

    _ready()
    text = _lz.workload(
        str(model),
        None if out is None else str(out),
        tp=tp,
        dtype=dtype,
        max_batch=max_batch,
        max_seq=max_seq,
        page_size=page_size,
    )
    return json.loads(text)


@_contextlib.contextmanager
def graph_safe(handle=None):
    """Inside this context, ``layerzero.ops`` select only kernels safe to capture into a CUDA
    graph (the policy's ``graph_strict_mode`` on top of ``handle``'s policy, default the
    process handle's); an op with no graph-safe kernel raises ``NoKernelError`` naming the op
    and each kernel's reasons (``GRAPH_UNSAFE``), rather than capturing something that
    would replay wrongly. Yields the strict handle."""
    global _graph_strict
    _ready()
    if handle is None:
        if _graph_strict is None:
            _graph_strict = _lz.graph_strict(None)
        strict = _graph_strict
    else:
        strict = _lz.graph_strict(handle)
    token = ops._scoped.set(strict)
    try:
        yield strict
    finally:
        ops._scoped.reset(token)


def _after_fork_in_child():
    # A forked child has none of the parent's threads: the runtime rebuilds its handle and
    # runs kernels in a pool of the child's own (see src/fork.rs); handles made here for the
    # parent are dropped. torch's OpenMP pool is the parent's too, and GNU OpenMP waits
    # forever for it in a child: the Python executors call torch, so the child runs torch on
    # one thread, as DataLoader does for its workers (torch.set_num_threads to change it).
    global _graph_strict
    _graph_strict = None
    _lz._after_fork_in_child()
    torch = _sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


_atexit.register(_lz._flush_telemetry)

if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_after_fork_in_child)


def selftest(kernels=None, verbose=False):
    """Runs every registered Python executor against PyTorch's float64 math on small cases
    and records the result for this machine; passing executors become verified."""
    from ._selftest import selftest as run

    return run(kernels, verbose)


from . import distributed, ops, plugins  # noqa: E402

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
    "PlanMismatchError",
    "Reason",
    "ReasonCode",
    "Report",
    "SchemaError",
    "Selection",
    "UnknownHardwareError",
    "counters",
    "doctor",
    "explain",
    "graph_safe",
    "host",
    "readiness_check",
    "select",
    "selftest",
    "solve",
    "workload",
    "tune",
    "distributed",
    "ops",
    "plugins",
    "version",
    "which",
]
