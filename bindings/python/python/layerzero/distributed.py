"""Every rank serves the same choice: LayerZero over torch.distributed.

``layerzero.distributed.agree(handle=None, group=None, workload=None)`` checks, before a
distributed engine serves, that every rank of ``group`` (default: the world) would select
the same kernels: the same capabilities, policy (knob overrides included), dispatch table,
hardware and libraries, and with ``workload`` the same kernel for every bucket. Agreement is
one min/max all-reduce of four hash words; only when ranks differ do they gather each other's
facts, and then every rank raises ``layerzero.PlanMismatchError`` naming the ranks and what
differs. Hash words travel as int64 (gloo has no unsigned min/max); a group whose backend is
NCCL is agreed over a gloo side group of the same ranks. LayerZero opens no connection of its
own: the transport is torch.distributed's.
"""

from . import _lz

__all__ = ["agree", "agree_by_capability", "capability_group", "facts", "solve", "Group"]


class Group:
    """A torch.distributed process group as LayerZero's collectives: min/max all-reduce of
    int64 words, all-gather and broadcast of bytes, on CPU tensors over gloo."""

    def __init__(self, group=None):
        import torch.distributed as dist

        if not dist.is_initialized():
            raise _lz.InvalidInputError(
                "torch.distributed is not initialized: call torch.distributed.init_process_group first"
            )
        self._dist = dist
        backend = dist.get_backend(group)
        if backend != "gloo":
            # Agreement is a few words: run it over gloo on the CPU, beside the model's group.
            ranks = dist.get_process_group_ranks(group) if group is not None else None
            group = dist.new_group(ranks=ranks, backend="gloo")
        self.group = group

    def rank(self):
        return self._dist.get_rank(self.group)

    def size(self):
        return self._dist.get_world_size(self.group)

    def all_reduce_min_max(self, words):
        import torch

        # One MIN all-reduce gives both: max(w) = ~min(~w) (bitwise not reverses the order of
        # int64 without overflowing, as negation would at the minimum).
        n = len(words)
        both = torch.tensor(list(words) + [~w for w in words], dtype=torch.int64)
        self._dist.all_reduce(both, op=self._dist.ReduceOp.MIN, group=self.group)
        got = both.tolist()
        return got[:n], [~w for w in got[n:]]

    def all_gather(self, data):
        out = [None] * self.size()
        self._dist.all_gather_object(out, bytes(data), group=self.group)
        return out

    def broadcast(self, data, root):
        src = self._dist.get_global_rank(self.group, root) if self.group is not None else root
        box = [bytes(data)]
        self._dist.broadcast_object_list(box, src=src, group=self.group)
        return box[0]


def agree(handle=None, group=None, workload=None):
    """Checks that every rank of ``group`` (a torch.distributed group, default the world) would
    serve the same kernels with ``handle`` (default: the process handle); with ``workload`` (a
    workload file), for every bucket. Returns None when they agree; raises
    ``PlanMismatchError`` on every rank otherwise."""
    from . import _ready

    _ready()
    g = group if isinstance(group, Group) else Group(group)
    _lz.agree(g, handle, None if workload is None else str(workload))


def solve(workload, group=None, *, perfdb=None, tune=False, budget=None, folder=None, mode="strict"):
    """One plan for every rank, from the root's timings: rank 0 of ``group`` (optionally tunes
    ``workload`` into its PerfDB, then) solves the workload, broadcasts the table, and every
    rank writes it to ``folder`` (default: a temporary folder), loads it
    (``LayerZero.host().with_plan(path, mode)``), and agrees with the others on it. Never a
    per-rank re-tune: the other ranks measure nothing. Returns this rank's handle serving the
    plan; raises ``PlanMismatchError`` on every rank when one would serve differently (another
    policy, another catalog, another machine)."""
    import os
    import tempfile

    from . import LayerZero, _ready
    from . import solve as solve_table
    from . import tune as tune_workload

    _ready()
    g = group if isinstance(group, Group) else Group(group)
    table = b""
    error = ""
    if g.rank() == 0:
        try:
            with tempfile.TemporaryDirectory(prefix="lz-root-") as tmp:
                if tune:
                    tune_workload(workload, perfdb=perfdb, budget=budget, verify=False)
                path = os.path.join(tmp, "table.json")
                solve_table(workload, path, perfdb=perfdb)
                with open(path, "rb") as f:
                    table = f.read()
        except Exception as e:  # noqa: BLE001 - every rank must hear of it, not hang
            error = f"{type(e).__name__}: {e}"
    # The root's outcome reaches every rank: the table, or why there is none.
    message = g.broadcast((b"E" + error.encode()) if error else (b"T" + table), 0)
    if message[:1] == b"E":
        raise _lz.LayerZeroError(f"rank 0 could not solve {workload}: {message[1:].decode()}")
    folder = folder or tempfile.mkdtemp(prefix="lz-plan-")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"table-rank{g.rank()}.json")
    with open(path, "wb") as f:
        f.write(message[1:])
    handle = LayerZero.host().with_plan(path, mode)
    agree(handle, g, workload)
    return handle


def facts(handle=None, workload=None):
    """What decides this rank's choices, by name (the facts ``agree`` compares)."""
    from . import _ready

    _ready()
    return _lz.agreement_facts(handle, None if workload is None else str(workload))


def agree_by_capability(group=None, handle=None, workload=None, *, one_plan=None):
    """Agreement for heterogeneous ranks: the ranks of ``group`` gather each other's facts once
    and group themselves by hardware fingerprint; a capability group whose ranks differ fails
    every rank with ``PlanMismatchError``; what differs between groups is reported, not an
    error, unless one plan across every rank is asked for: by ``one_plan=True``, or by the
    policy's ``one_plan_across_ranks`` (``one_plan=None``, the default) on any rank. Returns
    ``{"groups": {fingerprint: [ranks]}, "differences": {fact: {fingerprint: value}}}``, the
    same on every rank."""
    from . import _ready

    _ready()
    g = group if isinstance(group, Group) else Group(group)
    groups, differences = _lz.agree_by_capability(
        g, handle, None if workload is None else str(workload), one_plan
    )
    return {"groups": groups, "differences": differences}


def capability_group(group=None, handle=None):
    """This rank's capability group: the ranks of ``group`` (default: the world) whose hardware
    fingerprint is this rank's, as a ``Group`` over a new gloo group. Every rank of ``group``
    must call it (torch.distributed creates every subgroup on every rank, in the same order).
    ``solve(workload, capability_group())`` then has the root of each kind of machine solve
    for its own kind."""
    from . import _ready

    _ready()
    g = group if isinstance(group, Group) else Group(group)
    mine = facts(handle)["hardware"]
    everyone = [bytes(b).decode() for b in g.all_gather(mine.encode())]
    dist = g._dist
    chosen = None
    for fingerprint in sorted(set(everyone)):
        ranks = [r for r, f in enumerate(everyone) if f == fingerprint]
        members = [dist.get_global_rank(g.group, r) if g.group is not None else r for r in ranks]
        sub = dist.new_group(ranks=members, backend="gloo")
        if fingerprint == mine:
            chosen = sub
    return Group(chosen)
