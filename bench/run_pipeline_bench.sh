#!/usr/bin/env bash
# Builds the fine-grained (pipeline) mode's GPU benchmark here and runs it on
# the GPU machine (docs/benchmarks.md, "Fine-grained (pipeline) mode on the
# GPU").
#
# Here (the build machine, no GPU):
#   bench/run_pipeline_bench.sh
# builds `bazel build --config=gpu -c opt //bench:pipeline_bench`, copies the
# binary and this script into .gpu/pipeline/ (ignored by git; the bazel-bin
# symlink does not travel), and prints the one command for the `run` tool
# (kind "nvidia-h200", carry [".gpu/pipeline"]).
#
# There (`--on-device`, from the repository root): records the device, then
# runs pipeline_bench at hidden 4096 x 8192 tokens, 8 layers, 10 timed steps
# (PIPELINE_FLAGS adds or overrides flags). Writes to $OUT: device.txt,
# clocks.csv (nvidia-smi every 200 ms), pipeline.md (the table, stdout),
# pipeline.log (stderr: per-configuration lines, Megatron's summary tables,
# engine warnings). Exits non-zero if the run failed or was not
# bit-identical.
set -uo pipefail

build_here() {
  set -e
  cd "$(dirname "$0")/.."
  bazel build --config=gpu -c opt //bench:pipeline_bench
  local bin
  bin="$(bazel info --config=gpu -c opt bazel-bin 2>/dev/null)"
  mkdir -p .gpu/pipeline
  cp -f "$bin/bench/pipeline_bench" bench/run_pipeline_bench.sh .gpu/pipeline/
  chmod -R u+w .gpu/pipeline
  echo
  echo "Copied to .gpu/pipeline/: pipeline_bench run_pipeline_bench.sh ($(du -sh .gpu/pipeline | cut -f1))"
  echo "On the GPU machine (run tool, kind \"nvidia-h200\", carry [\".gpu/pipeline\"]):"
  echo
  echo "  bash .gpu/pipeline/run_pipeline_bench.sh --on-device"
}

on_device() {
  local out="${OUT:-/tmp/gpu_out}"
  local dir
  dir="$(cd "$(dirname "$0")" && pwd)"
  mkdir -p "$out"
  export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  {
    nvidia-smi --query-gpu=name,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,driver_version,memory.total,clocks.max.sm --format=csv
    uname -a
    nproc
  } >"$out/device.txt" 2>&1
  cat "$out/device.txt"
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
    --format=csv -lms 200 >"$out/clocks.csv" 2>&1 &
  local smi=$!
  timeout --kill-after=10 "${BENCH_TIMEOUT_S:-420}" \
    "$dir/pipeline_bench" --hidden=4096 --tokens=8192 --layers=8 --steps=10 \
    --warmup=2 ${PIPELINE_FLAGS:-} >"$out/pipeline.md" 2>"$out/pipeline.log"
  local rc=$?
  cat "$out/pipeline.md" "$out/pipeline.log"
  kill "$smi" 2>/dev/null
  wait "$smi" 2>/dev/null
  if [[ $rc -ne 0 ]]; then
    echo "FAILED: pipeline_bench rc=$rc"
    return 1
  fi
  return 0
}

case "${1:-}" in
  --on-device) on_device ;;
  "") build_here ;;
  *) echo "usage: $0 [--on-device]" >&2; exit 2 ;;
esac
