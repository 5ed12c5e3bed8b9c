"""Writes tests/data/upstream_cases/<library>.json from the upstream libraries' test suites at
the commits the capability files name (issue 34). Usage, from the repository root:

    python3 tools/upstream_cases/main.py --mirror flashinfer=PATH/TO/flashinfer.git \
        --mirror flash_attn=PATH/TO/flash-attention.git ...

Each `--mirror` names a library module of this folder and a git directory holding the commit
(a bare mirror or a checkout's .git), or a plain directory holding the files the module reads as
they are at that commit (for a repository too large to mirror, e.g. torch_sdpa=DIR with
DIR/test/test_transformers.py); libraries without one are left as they are.
"""

import argparse
import importlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "tests", "data", "upstream_cases")


def compact(doc):
    """The fixture with one case (and one unexpressible entry) per line: small, and a
    regenerated file diffs case by case."""
    head = {k: v for k, v in doc.items() if k not in ("cases", "unexpressible")}
    lines = ["{"]
    lines += [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    for key in ("cases", "unexpressible"):
        items = doc[key]
        lines.append(f' "{key}": [')
        lines += [" " + json.dumps(x, separators=(",", ":")) + ("," if i + 1 < len(items) else "") for i, x in enumerate(items)]
        lines.append(" ]," if key == "cases" else " ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mirror", action="append", default=[], metavar="LIBRARY=GITDIR")
    args = p.parse_args()
    sys.path.insert(0, HERE)
    os.makedirs(OUT, exist_ok=True)
    for spec in args.mirror:
        library, _, gitdir = spec.partition("=")
        module = importlib.import_module(library)
        fixture = module.extract(gitdir)
        path = os.path.join(OUT, f"{fixture.library}.json")
        with open(path, "w") as f:
            f.write(compact(fixture.to_json()))
        print(f"{path}: {len(fixture.cases)} cases, {len(fixture.unexpressible)} unexpressible")


if __name__ == "__main__":
    main()
