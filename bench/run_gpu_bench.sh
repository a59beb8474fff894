#!/usr/bin/env bash
# Builds the GPU benchmark here and runs it on the GPU machine.
#
# Here (the build machine, no GPU):
#   bench/run_gpu_bench.sh
# builds `bazel build --config=gpu -c opt //bench:layer_stack_bench`, copies
# the binary, this script and gpu_bench_steps.sh (the steps this script and
# run_pipeline_bench.sh share) into .gpu/bench/ (ignored by git; the bazel-bin
# symlink does not travel), and prints the one command for the `run` tool
# (kind "nvidia-h200", carry [".gpu/bench"]).
#
# There (`--on-device`, from the repository root): records the device, then
# runs the layer stack at hidden 4096 x 8192 tokens and hidden 2048 x 16384
# tokens (8 layers, k = 0..6). Logs go to $OUT: device.txt, clocks.csv
# (nvidia-smi every 200 ms while the benchmark runs), h4096.md,
# h2048.md (the tables), h4096.log, h2048.log (stderr: progress, engine
# warnings), and the timeline of one step at k = 0 and k = $TIMELINE_K
# (default 4; empty: none) as h4096_k4.json / .svg and h2048_k4.json / .svg
# (--timeline_k, --timeline_prefix; bench/gpu_timeline.h), packed into
# timelines.tar (the run tool brings back at most 8 files). Exits non-zero
# if a run failed or was not bit-identical. Extra flags for both runs go in
# BENCH_FLAGS, e.g. BENCH_FLAGS=--push_at=layer TIMELINE_K= (the old push
# points, no timelines). BUDGET_K lists the byte-budget rows (--budget_k;
# default 1,2,2.5,...,6; empty: none). GRAPH_K lists the CUDA graph rows
# (--graph_k: the step captured once and launched, against eager steps of
# the same k; default 0,2,4; empty: none). JOINT_K and CKPT_K list the joint
# plan's rows and the recompute-only rows (--joint_k, --ckpt_k, SPEC §4.8;
# default none).
#
# The engine-only host cost (simulator, Google Benchmark) runs here instead:
#   bazel run -c opt //bench:engine_host_cost_benchmark
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_bench_steps.sh"

build_here() {
  pack_for_device layer_stack_bench bench run_gpu_bench.sh
}

on_device() {
  local out dir smi
  start_device
  local failures=0
  local timeline_k="${TIMELINE_K-4}"
  # Byte-budget rows (SPEC §4.7; empty: none), at TE's k = 1..6 and between.
  local budget_k="${BUDGET_K-1,2,2.5,3,3.5,4,4.5,5,5.5,6}"
  local budget=()
  [[ -n "$budget_k" ]] && budget=(--budget_k="$budget_k")
  # Joint-plan and recompute-only rows (SPEC §4.8; empty: none).
  local joint_k="${JOINT_K-}" ckpt_k="${CKPT_K-}"
  [[ -n "$joint_k" ]] && budget+=(--joint_k="$joint_k")
  [[ -n "$ckpt_k" ]] && budget+=(--ckpt_k="$ckpt_k")
  # CUDA graph rows (SPEC §5.7; empty: none).
  local graph_k="${GRAPH_K-0,2,4}"
  local graph=()
  [[ -n "$graph_k" ]] && graph=(--graph_k="$graph_k")
  for cfg in "4096 8192" "2048 16384"; do
    set -- $cfg
    local name="h$1"
    local timeline=()
    if [[ -n "$timeline_k" ]]; then
      timeline=(--timeline_k="$timeline_k"
                --timeline_prefix="$out/${name}_k$timeline_k")
    fi
    echo "===== hidden $1 tokens $2"
    timeout --kill-after=10 "${BENCH_TIMEOUT_S:-240}" \
      "$dir/layer_stack_bench" --hidden="$1" --tokens="$2" "${timeline[@]}" \
      "${budget[@]}" "${graph[@]}" \
      ${BENCH_FLAGS:-} \
      >"$out/$name.md" 2>"$out/$name.log"
    local rc=$?
    cat "$out/$name.md" "$out/$name.log"
    if [[ $rc -ne 0 ]]; then
      echo "FAILED: hidden $1 rc=$rc"
      failures=$((failures + 1))
    fi
  done
  stop_clocks
  local pictures
  pictures="$(cd "$out" && ls h*_k*.json h*_k*.svg 2>/dev/null)"
  if [[ -n "$pictures" ]]; then
    (cd "$out" && tar -cf timelines.tar $pictures && rm -f $pictures)
    echo "timelines.tar: $(echo $pictures)"
  fi
  return $((failures > 0))
}

gpu_bench_main "$@"
