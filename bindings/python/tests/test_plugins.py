"""Python plugins (issue 29): a package declaring a ``layerzero.backends`` entry point is
locked with ``python -m layerzero.plugins lock``, loaded with no code change, and its kernel
runs through LayerZero and matches PyTorch; unlocked, tampered-with or disallowed packages are
refused before anything of them is imported. Each case runs in a fresh interpreter, as a
serving process would start."""

import base64
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import pytest

pytest.importorskip("torch")

PLUGIN = textwrap.dedent(
    '''
    import torch

    CALLS = []

    KERNEL = {
        "id": "lzplug.rms_norm.torch", "op": "rms_norm",
        "constraints": {"dtypes": ["f32"], "strides": "contiguous"},
        "properties": {"deterministic": True, "graph_safe": False, "needs_jit": False, "workspace_bytes": 0},
        "perf": {"eff_compute": 0.2, "eff_mem": 0.4, "launch_ns": 3000},
    }

    def rms_norm(tensors, attrs):
        CALLS.append(1)
        x, w = tensors["x"], tensors["weight"]
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + attrs.get("eps", 1e-6)) * w

    def backend():
        return {
            "capabilities": {
                "schema_version": 1, "backend": "lzplug", "description": "A Python test plugin.",
                "device": "cpu", "version": "0.1.0", "execution": "external", "kernels": [KERNEL],
            },
            "executors": {"lzplug.rms_norm.torch": rms_norm},
        }
    '''
)

USE = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("ignore")
    import torch
    import layerzero as lz
    x, w = torch.randn(3, 64), torch.rand(64) + 0.5
    kernel = lz.select("rms_norm", x=x, weight=w).kernel
    out = lz.ops.rms_norm(x, w, eps=1e-6)
    want = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    print(json.dumps({
        "kernel": kernel,
        "imported": "lzplug" in sys.modules,
        "calls": len(sys.modules["lzplug"].CALLS) if "lzplug" in sys.modules else 0,
        "diff": (out.double() - want).abs().max().item(),
        "state": lz.plugins.states().get("lzplug"),
    }))
    """
)


def _sha256(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@pytest.fixture
def site(tmp_path):
    """An installed distribution `lzplug` 0.1.0 laid out as pip lays out a wheel."""
    site = tmp_path / "site"
    (site / "lzplug").mkdir(parents=True)
    info = site / "lzplug-0.1.0.dist-info"
    info.mkdir()
    files = {
        "lzplug/__init__.py": PLUGIN.encode(),
        "lzplug-0.1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: lzplug\nVersion: 0.1.0\n",
        "lzplug-0.1.0.dist-info/entry_points.txt": b"[layerzero.backends]\nlzplug = lzplug:backend\n",
    }
    record = []
    for rel, data in files.items():
        (site / rel).write_bytes(data)
        record.append(f"{rel},{_sha256(data)},{len(data)}")
    record.append("lzplug-0.1.0.dist-info/RECORD,,")
    (info / "RECORD").write_text("\n".join(record) + "\n")
    return site


def run(tmp_path, site, args, python=sys.executable, **env):
    full = dict(os.environ, LAYERZERO_LOCK=str(tmp_path / "layerzero.lock"))
    for name in ("LAYERZERO_POLICY", "PYTHONPATH"):
        full.pop(name, None)
    if site is not None:
        full["PYTHONPATH"] = str(site)
    full.update(env)
    return subprocess.run([str(python), *args], cwd=tmp_path, env=full, capture_output=True, text=True, timeout=300)


def use(tmp_path, site, prefer=False, **env):
    # A policy may name a plugin's kernels only when the plugin loads.
    rules = [{"action": "prefer", "kernels": "lzplug@*", "factor": 1e-6}] if prefer else []
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"rules": rules, **env.pop("fields", {})}))
    done = run(tmp_path, site, ["-c", USE], LAYERZERO_POLICY=str(policy), **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def lock(tmp_path, site):
    done = run(tmp_path, site, ["-m", "layerzero.plugins", "lock", "lzplug"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("locked lzplug@0.1.0"), done.stdout


def test_a_locked_python_plugin_loads_without_code_changes_and_its_kernel_matches_torch(tmp_path, site):
    lock(tmp_path, site)
    entry = json.loads((tmp_path / "layerzero.lock").read_text())["plugins"][0]
    assert (entry["kind"], entry["name"], entry["version"]) == ("python", "lzplug", "0.1.0")
    got = use(tmp_path, site, prefer=True)
    assert got["kernel"] == "lzplug@0.1.0.rms_norm.torch", got
    assert got["calls"] >= 1, "the plugin's executor ran"
    assert got["diff"] < 1e-5, got
    assert got["state"]["error"] is None and got["state"]["kernels"] == ["lzplug@0.1.0.rms_norm.torch"]


def test_an_unlocked_python_plugin_is_not_imported(tmp_path, site):
    got = use(tmp_path, site)
    assert not got["imported"], "nothing of an unlocked plugin runs"
    assert got["kernel"] != "lzplug@0.1.0.rms_norm.torch"
    assert "PLUGIN_NOT_LOCKED" in got["state"]["error"], got


def test_a_python_plugin_changed_after_it_was_locked_is_not_imported(tmp_path, site):
    lock(tmp_path, site)
    init = site / "lzplug" / "__init__.py"
    init.write_text(init.read_text() + "\nimport os  # a change after install\n")
    got = use(tmp_path, site)
    assert not got["imported"], "the changed file never ran"
    assert "PLUGIN_HASH_MISMATCH" in got["state"]["error"] and "lzplug/__init__.py" in got["state"]["error"], got


def test_a_python_plugin_the_policy_does_not_allow_is_not_imported(tmp_path, site):
    lock(tmp_path, site)
    got = use(tmp_path, site, fields={"allow_plugins": ["fusedops@*"]})
    assert not got["imported"]
    assert "PLUGIN_NOT_ALLOWED" in got["state"]["error"], got


def _wheel(path, plugin_source, extra=None):
    """A wheel of `lzplug` 0.1.0 holding `plugin_source` (and `extra` members), as a build
    backend writes one."""
    files = {
        "lzplug/__init__.py": plugin_source.encode(),
        "lzplug-0.1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: lzplug\nVersion: 0.1.0\n",
        "lzplug-0.1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        "lzplug-0.1.0.dist-info/entry_points.txt": b"[layerzero.backends]\nlzplug = lzplug:backend\n",
    }
    record = "".join(f"{rel},{_sha256(data)},{len(data)}\n" for rel, data in files.items())
    files["lzplug-0.1.0.dist-info/RECORD"] = (record + "lzplug-0.1.0.dist-info/RECORD,,\n").encode()
    with zipfile.ZipFile(path, "w") as z:
        for rel, data in {**files, **(extra or {})}.items():
            z.writestr(rel, data)


def _lz_binary():
    """The `lz` of this checkout (cargo builds it when it is stale)."""
    root = pathlib.Path(__file__).resolve().parents[3]
    if shutil.which("cargo") is None:
        pytest.skip("cargo is not on PATH, so lz cannot be built here")
    subprocess.run(["cargo", "build", "-q", "-p", "layerzero-cli", "--bin", "lz"], cwd=root, check=True, timeout=1800)
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", root / "target"))
    return target / "debug" / "lz"


def _venv(tmp_path):
    """A new environment that sees this one's packages (layerzero, torch) and installs into its own."""
    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=300)
    python = env / "bin" / "python"
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    here = sysconfig.get_path("purelib")
    # A .pth line that starts with `import` runs: addsitedir also reads this environment's .pth files.
    pathlib.Path(own, "parent_env.pth").write_text(f"import site; site.addsitedir({here!r})\n")
    return python


def _hub(root, variants):
    """A hub repository `root/lzplug` whose python variants are `{name: (torch, wheel extra)}`."""
    repo = root / "lzplug"
    for name, (built_for, extra) in variants.items():
        variant = repo / "build" / name
        variant.mkdir(parents=True)
        _wheel(variant / "lzplug-0.1.0-py3-none-any.whl", PLUGIN, extra)
        meta = {"kind": "python", "abi": 1, "os": "any", "arch": "any", "entry_point": "lzplug", "torch": built_for,
                "library": "lzplug-0.1.0-py3-none-any.whl"}
        (variant / "metadata.json").write_text(json.dumps(meta))
    return repo


def _add(tmp_path, lz_bin, python, repo):
    return subprocess.run(
        [str(lz_bin), "plugin", "add", str(repo), "--python", str(python), "--lock", str(tmp_path / "layerzero.lock")],
        env=dict(os.environ, LAYERZERO_HOME=str(tmp_path / "home")), capture_output=True, text=True, timeout=600,
    )


def _torch_mm():
    import torch

    return ".".join(torch.__version__.split(".")[:2])


def test_lz_plugin_add_installs_a_python_variant_from_a_hub_and_refuses_a_changed_one(tmp_path):
    lz_bin, python = _lz_binary(), _venv(tmp_path)
    repo = _hub(tmp_path / "hub", {"a-python": (_torch_mm(), None), "b-old-torch": ("1.0", None)})
    lock_file = tmp_path / "layerzero.lock"

    def add():
        return _add(tmp_path, lz_bin, python, repo)

    done = add()
    assert done.returncode == 0, done.stderr
    assert "chose    a-python" in done.stdout, done.stdout
    assert "rejected b-old-torch: built for torch 1.0" in done.stdout, done.stdout
    entry = json.loads(lock_file.read_text())["plugins"][0]
    assert (entry["kind"], entry["name"], entry["variant"]) == ("python", "lzplug", "a-python"), entry
    assert len(entry["download_blake3"]) == 64
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"rules": [{"action": "prefer", "kernels": "lzplug@*", "factor": 1e-6}]}))
    ran = run(tmp_path, None, ["-c", USE], python=python, LAYERZERO_POLICY=str(policy))
    assert ran.returncode == 0, ran.stderr
    got = json.loads(ran.stdout.strip().splitlines()[-1])
    assert got["kernel"] == "lzplug@0.1.0.rms_norm.torch" and got["calls"] >= 1 and got["diff"] < 1e-5, got
    # The hub now serves another wheel under the same name: refused before pip touches the environment.
    _wheel(repo / "build" / "a-python" / "lzplug-0.1.0-py3-none-any.whl", PLUGIN + "\nCHANGED = True\n")
    again = add()
    assert again.returncode == 2, again.stdout
    assert "PLUGIN_HASH_MISMATCH" in again.stderr, again.stderr
    installed = run(tmp_path, None, ["-c", "import lzplug; print(hasattr(lzplug, 'CHANGED'))"], python=python)
    assert installed.stdout.strip() == "False", installed


def test_a_hub_wheel_with_a_member_outside_the_install_folder_is_refused_before_pip(tmp_path):
    lz_bin, python = _lz_binary(), _venv(tmp_path)
    repo = _hub(tmp_path / "hub", {"a-python": (_torch_mm(), {"../../escaped.py": b"x = 1\n"})})
    done = _add(tmp_path, lz_bin, python, repo)
    assert done.returncode == 2, done.stdout
    assert "PLUGIN_PATH_UNSAFE" in done.stderr and "../../escaped.py" in done.stderr, done.stderr
    listed = run(tmp_path, None, ["-m", "pip", "list", "--format=freeze"], python=python)
    assert "lzplug" not in listed.stdout, "nothing was installed"
    assert not (tmp_path / "layerzero.lock").exists(), "nothing was locked"
