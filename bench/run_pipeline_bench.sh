#!/usr/bin/env bash
# Builds the fine-grained (pipeline) mode's GPU benchmark here and runs it on
# the GPU machine (docs/benchmarks.md, "Fine-grained (pipeline) mode on the
# GPU").
#
# Here (the build machine, no GPU):
#   bench/run_pipeline_bench.sh
# builds `bazel build --config=gpu -c opt //bench:pipeline_bench`, copies the
# binary, this script and gpu_bench_steps.sh (the steps this script and
# run_gpu_bench.sh share) into .gpu/pipeline/ (ignored by git; the bazel-bin
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
source "$(dirname "${BASH_SOURCE[0]}")/gpu_bench_steps.sh"

build_here() {
  pack_for_device pipeline_bench pipeline run_pipeline_bench.sh
}

on_device() {
  local out dir smi
  start_device
  timeout --kill-after=10 "${BENCH_TIMEOUT_S:-420}" \
    "$dir/pipeline_bench" --hidden=4096 --tokens=8192 --layers=8 --steps=10 \
    --warmup=2 ${PIPELINE_FLAGS:-} >"$out/pipeline.md" 2>"$out/pipeline.log"
  local rc=$?
  cat "$out/pipeline.md" "$out/pipeline.log"
  stop_clocks
  if [[ $rc -ne 0 ]]; then
    echo "FAILED: pipeline_bench rc=$rc"
    return 1
  fi
  return 0
}

gpu_bench_main "$@"
