#!/usr/bin/env bash
# One-shot GPU check of kernels-cuda: every kernels-cuda test (which must really run, not
# skip) and the GPU benchmark, with logs and results written to $OUT.
#
# The H200 device image has CUDA, Python and PyTorch but no Rust toolchain, and nothing can be
# downloaded there, so the Rust binaries are built on a CPU machine first and carried:
#
#   1. here (CPU machine with cargo), from the repository root:
#        bash kernels-cuda/gpu-check.sh --prepare
#      builds the test binaries (lib unit tests, tests/cpu.rs, tests/gpu.rs) and the
#      gpu_bench example, strips them and puts them in kernels-cuda/gpu-bundle/ (git-ignored,
#      ~15 MB);
#   2. on the device, from the repository root, carrying kernels-cuda/gpu-bundle:
#        bash kernels-cuda/gpu-check.sh
#      (without a bundle, it builds in place when cargo exists there).
#
# Runtime on a 16-core H200 machine: expected 2-4 minutes; the timeouts cap it at ~7 minutes
# (tests 300 s, bench 120 s), so run it with the device tool's timeout_s=540.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CRATE="$ROOT/kernels-cuda"
BUNDLE="$CRATE/gpu-bundle"

if [[ "${1:-}" == "--prepare" ]]; then
  set -e
  cd "$ROOT"
  TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE"
  echo "== building the kernels-cuda test binaries (test profile)"
  cargo test -p kernels-cuda --no-run --message-format=json 2>/dev/null \
    | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("kernels_cuda", "cpu", "gpu"):
        kind = m["target"]["kind"][0]
        name = "unit" if kind == "lib" else m["target"]["name"]
        print(name, m["executable"])
' > "$BUNDLE/.list"
  while read -r name exe; do
    cp "$exe" "$BUNDLE/test-$name"
  done < "$BUNDLE/.list"
  rm "$BUNDLE/.list"
  echo "== building the gpu_bench example (release)"
  cargo build -p kernels-cuda --release --example gpu_bench
  cp "$TARGET/release/examples/gpu_bench" "$BUNDLE/gpu_bench"
  strip --strip-debug "$BUNDLE"/test-* "$BUNDLE/gpu_bench" 2>/dev/null || true
  {
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(ldd --version | head -1)"
    echo "git: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo '?') (working tree may differ)"
    echo "ptx manifest sha256: $(sha256sum "$CRATE/ptx/manifest.toml" | cut -d' ' -f1)"
  } > "$BUNDLE/BUILD_INFO"
  ls -la "$BUNDLE"
  du -sh "$BUNDLE"
  exit 0
fi

# ------------------------------------------------------------------------------------------
# On the GPU machine
# ------------------------------------------------------------------------------------------
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
status=0
note() { echo "$*" | tee -a "$SUMMARY"; }
T0=$(date +%s)

# cuBLAS, cuBLASLt and NVRTC come from the image's Python nvidia wheels (toolchain.md 1.5);
# the driver (libcuda.so.1) from the system.
SP=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null || true)
if [[ -n "$SP" && -d "$SP/nvidia" ]]; then
  WHEEL_LIBS=$(find "$SP/nvidia" -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd:)
  export LD_LIBRARY_PATH="$WHEEL_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  ls -1 "$BUNDLE" 2>/dev/null
  cat "$BUNDLE/BUILD_INFO" 2>/dev/null
} > "$OUT/env.txt" 2>&1
note "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"

if [[ -x "$BUNDLE/test-gpu" ]]; then
  note "using the prebuilt bundle: $(head -1 "$BUNDLE/BUILD_INFO" 2>/dev/null)"
elif command -v cargo >/dev/null 2>&1; then
  note "no bundle; cargo found: building in place"
  ( cd "$ROOT" && bash "$CRATE/gpu-check.sh" --prepare ) > "$OUT/build.log" 2>&1 || { note "FAIL: build (see build.log)"; status=1; }
else
  note "FAIL: no prebuilt bundle and no cargo: run 'bash kernels-cuda/gpu-check.sh --prepare' on a CPU machine and carry kernels-cuda/gpu-bundle"
  exit 1
fi

# The tests read cuda/, ptx/ and requirements-cuda.txt relative to the crate.
export CARGO_MANIFEST_DIR="$CRATE"
export RUST_BACKTRACE=1
TESTLOG="$OUT/tests.log"
: > "$TESTLOG"
for t in unit cpu gpu; do
  exe="$BUNDLE/test-$t"
  if [[ ! -x "$exe" ]]; then
    note "FAIL: missing $exe"
    status=1
    continue
  fi
  echo "===== test-$t" >> "$TESTLOG"
  t1=$(date +%s)
  ( cd "$CRATE" && timeout 300 "$exe" --test-threads=1 --nocapture ) >> "$TESTLOG" 2>&1
  rc=$?
  result=$(grep -E '^test result:' "$TESTLOG" | tail -1)
  note "test-$t: exit $rc in $(( $(date +%s) - t1 )) s; $result"
  [[ $rc -ne 0 ]] && status=1
done
grep -E '^test .* FAILED$|panicked at' "$TESTLOG" | head -20 | tee -a "$SUMMARY"
if grep -qE 'SKIP [a-z0-9_]+: ' "$TESTLOG"; then
  note "FAIL: tests skipped on a GPU machine:"
  grep -oE 'SKIP [a-z0-9_]+: .*' "$TESTLOG" | head -5 | tee -a "$SUMMARY"
  status=1
fi
grep -E 'worst \|diff\|' "$TESTLOG" | tee -a "$SUMMARY"

if [[ -x "$BUNDLE/gpu_bench" ]]; then
  t1=$(date +%s)
  timeout 120 "$BUNDLE/gpu_bench" --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
  rc=$?
  note "gpu_bench: exit $rc in $(( $(date +%s) - t1 )) s"
  [[ $rc -ne 0 ]] && status=1
  if grep -q '^SKIP' "$OUT/bench.txt"; then
    note "FAIL: the benchmark skipped on a GPU machine"
    status=1
  fi
  tee -a "$SUMMARY" < "$OUT/bench.txt"
else
  note "FAIL: missing gpu_bench"
  status=1
fi

note "total: $(( $(date +%s) - T0 )) s; status $status"
exit $status
