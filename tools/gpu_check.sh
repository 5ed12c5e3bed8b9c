#!/usr/bin/env bash
# LayerZero on a real GPU (issue 31): detection, the seed's GPU kernels through LayerZero,
# the cost model against measured times, CUDA graphs, models. Writes OUT_DIR/report.json
# and OUT_DIR/report.md; see tools/gpu_check.py for the steps.
#
#   tools/gpu_check.sh OUT_DIR [gpu_check.py options...]
#
# Needs: an NVIDIA GPU with torch (and transformers) installed; `lz` built
# (`cargo build --release -p layerzero-cli`, or LZ=path); the package importable (installed,
# or its extension built in place: `maturin develop --release -m bindings/python/Cargo.toml`).
# Wheels in .whl/ (Liger-Kernel, say: pure Python, carried to a machine with no network) are
# installed into a scratch folder first.
set -euo pipefail
out=${1:?usage: tools/gpu_check.sh OUT_DIR [options]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
if compgen -G "$root/.whl/*.whl" > /dev/null; then
    site=$(mktemp -d /tmp/lz-gpu-site.XXXXXX)
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$root"/.whl/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
# Probed from / : run from the repository root, the Rust crate's folder `layerzero/` would be
# imported as an empty namespace package and hide that the Python package is missing.
if ! (cd / && "$py" -c "import layerzero._lz") 2> /dev/null; then
    export PYTHONPATH="$root/bindings/python/python${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
mkdir -p "$out"
exec "$py" "$root/tools/gpu_check.py" --out "$out" --lz "${LZ:-$root/target/release/lz}" "$@"
