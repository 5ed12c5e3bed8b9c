"""Plugins from Python packages: kernels a package declares through an entry point in the
``layerzero.backends`` group, loaded with no change to the code that calls LayerZero.

A package declares, in its ``pyproject.toml``::

    [project.entry-points."layerzero.backends"]
    mykernels = "mykernels.layerzero:backend"

and ``backend()`` returns ``{"capabilities": ..., "executors": {...}}``: a capabilities
document (a dict or its JSON text, of the capabilities schema, backend ``mykernels``, with a
``version``) and, for each kernel it declares (``mykernels.rms_norm.torch``), a callable
``fn(tensors, attrs)`` as the seed's Python backends have. Its kernels live in its namespace,
``mykernels@VERSION.rms_norm.torch``, as a C-ABI plugin's do.

Nothing of a plugin is imported until it has been checked: the lockfile (``LAYERZERO_LOCK``,
else ``./layerzero.lock``) must pin it (``PLUGIN_NOT_LOCKED``), the policy's
``allow_plugins`` must name it (``PLUGIN_NOT_ALLOWED``), its distribution's ``RECORD`` must be
the one locked and every installed file must match the sha256 ``RECORD`` lists
(``PLUGIN_HASH_MISMATCH``); after it is imported, the capabilities it returns must be the
locked ones and valid (``PLUGIN_HASH_MISMATCH``, ``PLUGIN_CAPABILITIES_INVALID``). A plugin
refused is left out with a warning, and ``states()`` says why; the others still load.

Pin one with ``python -m layerzero.plugins lock NAME`` (this imports it: lock only packages
you trust). Python plugins run in this process: ``isolation: subprocess`` is for C-ABI plugins.
"""

import base64
import hashlib
import json
import stat
import sys
import warnings
import zipfile
from importlib import metadata

from . import _lz

GROUP = "layerzero.backends"

# entry point name -> {"namespace": ..., "distribution": ..., "kernels": [...], "error": ...}
_STATES = {}


def states():
    """Each ``layerzero.backends`` entry point found at load, with the kernels it added or
    why it was refused (``error``, naming the reason code)."""
    return {name: dict(state) for name, state in _STATES.items()}


def _refuse(code, message):
    return _lz.InvalidInputError(f"{message} ({code})")


def _record(dist, name):
    for f in dist.files or []:
        if f.name == "RECORD" and f.parent.name.endswith(".dist-info"):
            return dist.locate_file(f)
    raise _refuse(
        "PLUGIN_NOT_LOADABLE",
        f"plugin {name}: its distribution {dist.metadata['Name']} has no RECORD (install it as a wheel)",
    )


def _check_files(dist, name):
    """Every file the distribution's RECORD hashes still has that sha256."""
    for f in dist.files or []:
        if f.hash is None:
            continue
        path = dist.locate_file(f)
        try:
            with open(path, "rb") as fh:
                digest = hashlib.new(f.hash.mode, fh.read()).digest()
        except OSError as e:
            raise _refuse("PLUGIN_HASH_MISMATCH", f"plugin {name}: {f} is missing ({e})") from None
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != f.hash.value:
            raise _refuse(
                "PLUGIN_HASH_MISMATCH",
                f"plugin {name}: {f} is not the file its RECORD lists (changed after install); it is not imported",
            )


def _declared(name, obj):
    declared = obj() if callable(obj) else obj
    if not isinstance(declared, dict) or "capabilities" not in declared or "executors" not in declared:
        raise _refuse(
            "PLUGIN_CAPABILITIES_INVALID",
            f"plugin {name}: its entry point returns {type(declared).__name__}, not "
            '{"capabilities": ..., "executors": {...}}',
        )
    caps = declared["capabilities"]
    text = caps if isinstance(caps, str) else json.dumps(caps, sort_keys=True)
    executors = declared["executors"]
    if not isinstance(executors, dict) or not all(callable(f) for f in executors.values()):
        raise _refuse("PLUGIN_CAPABILITIES_INVALID", f"plugin {name}: executors must map kernel ids to callables")
    return text, executors


def _entry_points():
    return list(metadata.entry_points(group=GROUP))


def install():
    """Loads every ``layerzero.backends`` entry point the lockfile pins and the policy
    allows; a refused one is left out with a warning (``states()``)."""
    for ep in _entry_points():
        dist = ep.dist
        state = {"namespace": f"{ep.name}@{dist.version}", "distribution": dist.metadata["Name"], "kernels": []}
        _STATES[ep.name] = state
        try:
            record = _record(dist, ep.name)
            _lz.plugin_check(ep.name, dist.version, str(record))
            _check_files(dist, ep.name)
            text, executors = _declared(ep.name, ep.load())
            ids = dict(_lz.plugin_add(ep.name, dist.version, str(record), text))
            for kernel, fn in executors.items():
                if kernel not in ids:
                    raise _refuse(
                        "PLUGIN_CAPABILITIES_INVALID",
                        f"plugin {ep.name}: an executor for {kernel}, which its capabilities do not declare",
                    )
                _lz.register_executor(ids[kernel], fn, verified=True)
                state["kernels"].append(ids[kernel])
            state["error"] = None
        except Exception as e:  # noqa: BLE001 - a plugin's failure never stops the others
            state["error"] = str(e)
            warnings.warn(f"layerzero: plugin {ep.name} is not loaded: {e}", stacklevel=2)


def lock(name, lock_path=None):
    """Pins the ``layerzero.backends`` entry point ``name`` in the lockfile (default
    ``LAYERZERO_LOCK``, else ``./layerzero.lock``): its distribution's RECORD and the
    capabilities it returns. Imports it. Returns ``(lockfile, "NAME@VERSION")``."""
    found = [ep for ep in _entry_points() if ep.name == name]
    if not found:
        raise _lz.InvalidInputError(f"no installed package declares {name!r} in the {GROUP} entry points")
    ep = found[0]
    dist = ep.dist
    record = _record(dist, name)
    text, _ = _declared(name, ep.load())
    source = f"python:{dist.metadata['Name']}=={dist.version}"
    path, namespace = _lz.plugin_lock(name, source, str(record), text, lock_path)
    return str(path), namespace


def unsafe_members(wheel):
    """The members of the archive `wheel` that would land outside the folder it is installed
    into: absolute paths, paths through ``..``, and symlinks."""
    bad = []
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = info.filename.replace("\\", "/")
            absolute = name.startswith("/") or (len(name) > 1 and name[1] == ":")
            if absolute or ".." in name.split("/") or stat.S_ISLNK(info.external_attr >> 16):
                bad.append(info.filename)
    return bad


def _main(argv):
    usage = "usage: python -m layerzero.plugins lock NAME [--lock PATH] | list | check-archive WHEEL"
    if len(argv) == 2 and argv[0] == "check-archive":
        try:
            bad = unsafe_members(argv[1])
        except (OSError, zipfile.BadZipFile) as e:
            print(f"{argv[1]} is not a readable wheel: {e}", file=sys.stderr)
            return 2
        if bad:
            print(f"{argv[1]} has members that leave the install folder: {', '.join(bad)}", file=sys.stderr)
            return 3
        return 0
    if argv[:1] == ["list"]:
        for ep in _entry_points():
            print(f"{ep.name:<24} {ep.dist.metadata['Name']}=={ep.dist.version}  {ep.value}")
        return 0
    if len(argv) in (2, 4) and argv[0] == "lock" and (len(argv) == 2 or argv[2] == "--lock"):
        try:
            path, namespace = lock(argv[1], argv[3] if len(argv) == 4 else None)
        except _lz.LayerZeroError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"locked {namespace} in {path}")
        return 0
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
