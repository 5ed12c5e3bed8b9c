"""The seed's Python backends, registered with the runtime when their library imports.

Each module here is a thin call into one library (no reimplementation): ``torch_sdpa``
(``F.scaled_dot_product_attention`` forced to one SDPA backend), ``zendnn`` (AMD's
``zentorch``), ``flash_attn`` (FlashAttention 2 and 3), ``flashinfer``, ``xformers`` and
``liger``. ``install()`` (run on first use of the runtime) imports each library: one that
does not import is reported ``BACKEND_NOT_INSTALLED`` with its import error; one that does has
its version recorded (a version outside a kernel's ``library_versions`` is
``BACKEND_VERSION_UNSUPPORTED``) and its executors registered.

An executor is *verified* on this machine when this repository's CI runs it against a
reference (``CI_VERIFIED``) or ``layerzero.selftest()`` passed for it here with this library
version; any other is registered unverified, and selection refuses it
(``EXECUTOR_UNVERIFIED``) unless the policy sets ``allow_unverified``.
"""

import importlib
import threading

from .. import _lz
from . import _record

_MODULES = ["torch_sdpa", "zendnn", "flash_attn", "flashinfer", "xformers", "liger"]

_lock = threading.Lock()
_installed = False
# kernel id -> (backend module name, executor function)
EXECUTORS = {}
# backend -> {"library": ..., "installed": bool, "version": ..., "error": ...}
BACKENDS = {}


def _backend_modules():
    return [importlib.import_module(f"{__name__}.{m}") for m in _MODULES]


def install(force=False):
    """Imports every backend library and registers the executors of those that import.
    Idempotent; ``force`` probes again (after installing a library)."""
    global _installed
    with _lock:
        if _installed and not force:
            return
        # Packages' `layerzero.backends` entry points first, each checked before it is
        # imported, so that a policy naming their kernels holds once the handle is built.
        from .. import plugins

        plugins.install()
        records = _record.load()
        for mod in _backend_modules():
            for backend, library, probe, executors in mod.backends():
                try:
                    lib, version, path = probe()
                except Exception as e:  # noqa: BLE001 - any import failure means "not installed"
                    error = f"import {library}: {type(e).__name__}: {e}"
                    BACKENDS[backend] = {"library": library, "installed": False, "version": None, "error": error}
                    _lz.set_backend(backend, False, error=error)
                    continue
                BACKENDS[backend] = {"library": library, "installed": True, "version": version, "error": None}
                _lz.set_backend(backend, True, version=version, path=path)
                for kernel, fn in executors(lib).items():
                    EXECUTORS[kernel] = (backend, fn, version)
                    verified = kernel in mod.CI_VERIFIED or _record.passed(records, kernel, version)
                    _lz.register_executor(kernel, fn, verified=verified)
        _installed = True


def verification(kernel):
    """``"verified"`` or ``"unverified"`` for a registered kernel; ``None`` when none is."""
    entry = EXECUTORS.get(kernel)
    if entry is None:
        return None
    backend, _, version = entry
    mod = importlib.import_module(f"{__name__}.{_module_of(backend)}")
    if kernel in mod.CI_VERIFIED or _record.passed(_record.load(), kernel, version):
        return "verified"
    return "unverified"


def _module_of(backend):
    for name in _MODULES:
        mod = importlib.import_module(f"{__name__}.{name}")
        if any(b == backend for b, *_ in mod.backends()):
            return name
    raise KeyError(backend)
