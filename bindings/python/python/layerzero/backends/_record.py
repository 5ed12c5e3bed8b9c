"""Self-test results on this machine: which executor passed against the reference, with which
library version. Kept in ``<LAYERZERO_HOME>/selftest.json`` (where the PerfDB lives: the
user cache folder unless ``LAYERZERO_HOME`` says); a file that cannot be parsed is moved
aside, never trusted."""

import json
import os
import platform
import time
from pathlib import Path


def path():
    from .. import _lz

    return Path(_lz.home()) / "selftest.json"


def machine():
    """The machine a result holds for: CPU model and, where torch sees one, the GPU."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - no torch or no driver: no GPU
        gpu = None
    return f"{cpu} | {gpu}" if gpu else cpu


def load():
    p = path()
    try:
        data = json.loads(p.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
            raise ValueError("no results object")
        return data
    except FileNotFoundError:
        return {"results": {}}
    except (OSError, ValueError) as e:
        aside = p.with_suffix(f".corrupt-{int(time.time())}")
        try:
            p.rename(aside)
        except OSError:
            pass
        import warnings

        warnings.warn(f"layerzero: {p} could not be read ({e}); moved aside to {aside}", stacklevel=2)
        return {"results": {}}


def passed(records, kernel, version):
    r = records.get("results", {}).get(kernel)
    return bool(r) and r.get("ok") is True and r.get("version") == version and r.get("machine") == machine()


def save(results):
    """Merges ``results`` (kernel -> record) into the file, atomically."""
    data = load()
    data["results"].update(results)
    p = path()
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, p)
