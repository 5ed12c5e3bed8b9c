"""The wheel exports the lz.select / lz.dispatch spans when LAYERZERO_OTEL says."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

SCRIPT = """
import torch, layerzero as lz
x, w = torch.randn(2, 64), torch.ones(64)
lz.ops.rms_norm(x, w)
print(lz.which("rms_norm", x=x, weight=w))
"""


def test_spans_are_exported_to_stdout_when_layerzero_otel_says_so():
    env = dict(os.environ, LAYERZERO_OTEL="stdout")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "lz.dispatch" in done.stdout and "lz.select" in done.stdout, done.stdout[-2000:]


def test_a_bad_log_spec_warns_at_import_and_the_package_still_works():
    env = dict(os.environ, LAYERZERO_LOG="yaml")
    done = subprocess.run([sys.executable, "-W", "always", "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "LAYERZERO_LOG" in done.stderr
