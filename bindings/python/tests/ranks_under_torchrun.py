"""One rank under `torchrun --nproc-per-node 4` (run by test_distributed.py): agree on a
workload over gloo; with ODD_RANK set, that rank denies the CPU attention kernels first.

    python -m torch.distributed.run --standalone --nproc-per-node 4 ranks_under_torchrun.py WORKLOAD ODD_RANK|none FOLDER

Prints `rank R: agreed in T ms` or `rank R: PlanMismatchError: ...`; exits 1 on anything else.
"""

import json
import os
import sys
import time

import torch.distributed as dist

import layerzero as lz


def say(line):
    # One write per line: the ranks share the launcher's stdout.
    os.write(1, (line + "\n").encode())


def main():
    workload, odd, folder = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        handle = None
        if odd != "none" and rank == int(odd):
            policy = os.path.join(folder, f"deny-{rank}.json")
            with open(policy, "w") as f:
                json.dump({"rules": [{"action": "deny", "kernels": "cpu.attention.*"}]}, f)
            handle = lz.LayerZero.host().with_policy(policy)
        # The handle is built (backends probed) before the clock starts: what is timed is what
        # agreement adds to a start-up.
        lz.distributed.facts(handle, workload)
        dist.barrier()  # every rank ready: the clock measures the agreement, not the slowest start
        started = time.perf_counter()
        try:
            lz.distributed.agree(handle, workload=workload)
            say(f"rank {rank}: agreed in {(time.perf_counter() - started) * 1e3:.1f} ms")
        except lz.PlanMismatchError as e:
            say(f"rank {rank}: PlanMismatchError: {e}")
            if odd == "none":
                return 1
        return 0
    finally:
        # torch's advice: no rank tears its connections down while a peer still finishes the
        # last collective (gloo then aborts that peer).
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    code = main()
    # Leave without C++ static destructors: a gloo thread still winding down at exit makes
    # std::terminate abort a rank that has already passed (seen about once in 20 launches).
    sys.stdout.flush()
    os._exit(code)
