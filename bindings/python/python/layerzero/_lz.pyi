"""The extension module of `layerzero`: the runtime's front door over torch tensors."""

from os import PathLike
from typing import Any, Optional, Union

_Path = Union[str, PathLike[str]]

class LayerZeroError(Exception):
    """Every error LayerZero raises; `.reasons` lists each candidate's or attempt's reason."""

    reasons: list[Reason]

class InvalidInputError(LayerZeroError):
    """A request, argument or document is malformed or names an unknown value (the message names it)."""

class IoError(LayerZeroError):
    """A file could not be read or written."""

class SchemaError(LayerZeroError):
    """A document does not satisfy its JSON Schema."""

class NoKernelError(LayerZeroError):
    """No kernel qualifies for the call; `.reasons` says why, per candidate."""

class KernelFailedError(LayerZeroError):
    """Kernels qualified, but every eligible one failed when it ran; `.reasons` lists each attempt."""

class LockViolationError(LayerZeroError):
    """A policy lock names a kernel that is not eligible."""

class UnknownHardwareError(LayerZeroError):
    """A named hardware profile does not exist."""

class Reason:
    """Why a kernel was refused: a stable code and a message with the numbers."""

    @property
    def code(self) -> Any:
        """The code, a member of `layerzero.ReasonCode`."""
    @property
    def category(self) -> str:
        """`availability`, `constraint`, `policy`, `transform`, `capacity`, `health`, ..."""
    @property
    def message(self) -> str: ...

class Selection:
    """The kernel a call gets, where the choice came from, and its score."""

    kernel: str
    backend: str
    source: str
    """`plan`, `cache` or `live`."""
    transforms: list[str]
    estimated_ns: float
    score_source: str
    """`model`, `perfdb` or `blended`."""
    total_ns: float
    candidates: int
    rejected: int

class Candidate:
    """One candidate kernel's verdict."""

    @property
    def kernel(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def verdict(self) -> str:
        """`selected`, `eligible` or `rejected`."""
    @property
    def reasons(self) -> list[Reason]: ...
    @property
    def transforms(self) -> list[str]: ...
    @property
    def total_ns(self) -> Optional[float]: ...

class Report:
    """Every candidate of a call, every reason, the arithmetic."""

    @property
    def selected(self) -> Optional[str]: ...
    @property
    def candidates(self) -> list[Candidate]: ...
    @property
    def request_errors(self) -> list[Reason]: ...
    def candidate(self, kernel: str) -> Optional[Candidate]: ...
    def to_json(self) -> str:
        """The report as `lz explain --json` prints it."""

class LayerZero:
    """A handle of the runtime: one machine (detected or named), one policy, its plan and caches.

    Builders consume the handle and return the new one:
    `LayerZero.host().with_policy("policy.json").with_plan("plan.json", mode="strict")`.
    """

    @staticmethod
    def host() -> LayerZero:
        """This machine, configured by the `LAYERZERO_*` variables of the environment."""
    @staticmethod
    def detected() -> LayerZero:
        """This machine with the default policy and no variables read."""
    @staticmethod
    def planning(hardware: str) -> LayerZero:
        """Plans for a named profile (`h100`, `mi300x`, `spr`, ...) or a profile file."""
    def with_policy(self, path: _Path) -> LayerZero: ...
    def with_plan(self, path: _Path, mode: str = "prefer") -> LayerZero:
        """Serves the dispatch table at `path`; `mode` is `off`, `prefer` or `strict`."""
    def with_perfdb(self, path: _Path) -> LayerZero: ...
    def with_faults(self, spec: str) -> LayerZero:
        """Faults injected for drills (`LAYERZERO_FAULTS`' form: `KERNEL_OR_BACKEND=MODE,...`)."""
    def select(self, op: str, **kwargs: Any) -> Selection:
        """The kernel `op` gets: tensors (torch tensors) and attributes by name, e.g.
        `select("attention", q=q, k=k, v=v, causal=True)`; q/k/v are [batch, seq, heads,
        head_dim] unless `layout="BHSD"`; `layouts={"k_cache": "HND"}` tags others."""
    def explain(self, op: str, **kwargs: Any) -> Report: ...
    def which(self, op: str, **kwargs: Any) -> str: ...
    def counters(self) -> dict[str, int]: ...
    def readiness(self) -> list[dict[str, Any]]: ...
    @property
    def hardware(self) -> str: ...

def host() -> LayerZero:
    """The process-wide handle (made on first use from the environment, then shared)."""

def select(op: str, **kwargs: Any) -> Selection:
    """The kernel `op` gets on this machine (see `LayerZero.select`)."""

def explain(op: str, **kwargs: Any) -> Report:
    """Every candidate's verdict for `op` on this machine."""

def which(op: str, **kwargs: Any) -> str:
    """The id of the kernel `op` gets on this machine."""

def counters() -> dict[str, int]:
    """Plan and cache hits and misses, live selections, fallbacks of the process-wide handle."""

def doctor() -> dict[str, Any]:
    """This machine examined, as `lz doctor --json` reports it."""

def readiness_check(
    *,
    table: Optional[_Path] = None,
    policy: Optional[_Path] = None,
    workload: Optional[_Path] = None,
    perfdb: Optional[_Path] = None,
    require_warm: bool = False,
) -> list[dict[str, Any]]:
    """The checks of `lz readiness-check`; each failed one names its fix."""

def version() -> str: ...
def reason_codes() -> list[tuple[str, str]]: ...

class Call:
    """One shape of call (op, parsed attributes, tensor roles, layout, outputs), made once per
    distinct attributes by `layerzero.ops`."""

    def __init__(
        self, op: str, attrs: dict[str, Any], inputs: list[str], outputs: list[str], layout: Optional[str] = None
    ) -> None: ...

def dispatch(call: Call, inputs: tuple[Any, ...], outs: tuple[Any, ...], handle: Optional[LayerZero] = None) -> tuple[Any, ...]:
    """Selects and runs a kernel for `call` on CPU torch tensors (lent in place, the GIL
    released), writing into the `outs` buffers where the kernel can."""

def run_kernel(kernel: str, call: Call, inputs: tuple[Any, ...], outs: tuple[Any, ...]) -> tuple[Any, ...]:
    """Runs one of LayerZero's own kernels directly (no selection, health or fallback)."""

def register_executor(kernel: str, func: Any, *, verified: bool = True) -> None:
    """Binds a declared kernel to `func(tensors: dict, attrs: dict) -> Tensor | dict`; an
    unverified one is refused by selection (`EXECUTOR_UNVERIFIED`) unless the policy allows it."""

def set_backend(
    backend: str, installed: bool, *, version: Optional[str] = None, path: Optional[str] = None, error: Optional[str] = None
) -> None:
    """Records what Python found of an external backend (its version, or its import error)."""

def graph_strict(handle: Optional[LayerZero] = None) -> LayerZero:
    """A handle under `handle`'s policy (default: the process's) with graph-strict mode on."""

def tune(
    workload: str,
    *,
    perfdb: Optional[str] = None,
    budget: Optional[float] = None,
    verify: bool = True,
    refresh: bool = False,
    calibrate: Optional[str] = None,
    hardware: Optional[str] = None,
) -> dict[str, Any]:
    """`layerzero.tune`: the report of `lz tune --json`."""

def solve(workload: str, out: str, *, perfdb: Optional[str] = None) -> tuple[int, int]:
    """`layerzero.solve`: (entries, unsolved) of the table written to `out`."""

def workload(
    model: str,
    out: Optional[str] = None,
    *,
    tp: int = 1,
    dtype: Optional[str] = None,
    max_batch: int = 8,
    max_seq: Optional[int] = None,
    page_size: int = 16,
) -> str:
    """`layerzero.workload`: the workload's JSON (written to `out` when given)."""

def agree_by_capability(
    group: Any, handle: Optional[LayerZero] = None, workload: Optional[str] = None, one_plan: Optional[bool] = None
) -> tuple[dict[str, list[int]], dict[str, dict[str, str]]]:
    """`layerzero.distributed.agree_by_capability`: (groups, differences)."""

def _after_fork_in_child() -> None: ...
def home() -> str:
    """Where LayerZero keeps run-time state: `LAYERZERO_HOME`, else the user cache folder."""

class PlanMismatchError(LayerZeroError):
    """The ranks of a distributed engine would not serve the same kernels."""

def agree(group: Any, handle: Optional[LayerZero] = None, workload: Optional[str] = None) -> None:
    """`layerzero.distributed.agree` over a group object (rank, size, all_reduce_min_max,
    all_gather, broadcast)."""
