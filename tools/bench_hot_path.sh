#!/usr/bin/env bash
# E2E §18, the performance-regression check: the hot-path benchmark
# (layerzero/benches/hot_path.rs: plan hit, cache hit, typed select, dispatch overhead, live
# selection, cold start with and without warm-up) of this checkout and of a base commit, both
# built in release, run alternately ROUNDS times; per figure the median of each build's runs
# and the ratio this / base (above 1: slower than the base).
#
#   tools/bench_hot_path.sh [BASE_REV (default HEAD~1)] [ROUNDS (default 5)]
#
# The base is exported with `git archive` (no worktree is registered). A base without the
# benchmark gets this checkout's copy of it, so both builds run the same measuring code. The
# base builds in a target directory of its own ($BASE_TARGET_DIR, default
# $CARGO_TARGET_DIR/hot-path-base): Cargo names both trees' artifacts alike (package ids are
# workspace-relative) and judges them by the modification times of workspace-relative paths,
# so in one directory either tree's build could pass for the other's. The first run builds
# the dependencies there once.
set -euo pipefail

root=$(git rev-parse --show-toplevel)
base=${1:-HEAD~1}
rounds=${2:-5}
base_sha=$(git -C "$root" rev-parse --short "$base")
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
base_target=${BASE_TARGET_DIR:-$CARGO_TARGET_DIR/hot-path-base}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir "$tmp/base"
git -C "$root" archive "$base" | tar -x -C "$tmp/base"
# The exported files are dated at their commit, older than a previous base's artifacts: made
# newer than any, they are always compiled.
find "$tmp/base" -type f -exec touch {} +
if [ ! -f "$tmp/base/layerzero/benches/hot_path.rs" ]; then
  cp "$root/layerzero/benches/hot_path.rs" "$tmp/base/layerzero/benches/"
  printf '\n[[bench]]\nname = "hot_path"\nharness = false\n' >>"$tmp/base/layerzero/Cargo.toml"
fi

# Builds the benchmark in directory $1 (target directory $3) and copies its executable to $2.
build() {
  local exe
  exe=$( (cd "$1" && CARGO_TARGET_DIR=$3 cargo bench -q -p layerzero --bench hot_path --no-run --message-format=json) |
    grep -o '"executable":"[^"]*hot_path[^"]*"' | tail -1 | sed 's/"executable":"\(.*\)"/\1/')
  [ -x "$exe" ] || { echo "building in $1 gave no executable" >&2; exit 2; }
  cp "$exe" "$2"
}

echo "building this checkout ($(git -C "$root" rev-parse --short HEAD), $(git -C "$root" status --porcelain | wc -l) changed files) and $base ($base_sha) in release..." >&2
this_bin=$tmp/hot_path.this
base_bin=$tmp/hot_path.base
build "$root" "$this_bin" "$CARGO_TARGET_DIR"
build "$tmp/base" "$base_bin" "$base_target"

for r in $(seq 1 "$rounds"); do
  echo "round $r of $rounds" >&2
  "$this_bin" --bench | sed 's/^/this /' >>"$tmp/runs"
  "$base_bin" --bench | sed 's/^/base /' >>"$tmp/runs"
done

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
echo "hot path on $cpu, $rounds alternating runs each; medians in ns (each run's figure is itself a median of 15 batches)"
python3 - "$tmp/runs" "$base_sha" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    which, name, ns = line.split()
    runs.setdefault(name, {}).setdefault(which, []).append(float(ns))
print(f"{'figure':<38} {'this':>14} {'base ' + sys.argv[2]:>14} {'this/base':>10}")
for name, r in runs.items():
    t, b = statistics.median(r["this"]), statistics.median(r["base"])
    print(f"{name:<38} {t:>14.1f} {b:>14.1f} {t / b:>10.3f}")
m = {name: statistics.median(r["this"]) for name, r in runs.items()}
print(f"this checkout: a baked plan hit {m['plan_hit']:.1f} ns against live selection {m['live_select']:.1f} ns "
      f"({m['live_select'] / m['plan_hit']:.0f}x); cold first dispatch {m['cold_first_dispatch_without_warmup'] / 1e3:.1f} us "
      f"without warm-up, {m['cold_first_dispatch_after_warmup'] / 1e3:.1f} us after one ({m['cold_warmup'] / 1e3:.1f} us), "
      f"steady {m['steady_dispatch'] / 1e3:.1f} us")
EOF
