#!/usr/bin/env bash
# Builds the CUDA binaries here and runs them on the GPU machine.
#
# Here (the build machine, no GPU):
#   backends/cuda/run_on_gpu.sh
# builds `bazel build --config=gpu //backends/cuda:all
# //bench:cuda_copy_benchmark` and
# `bazel build --config=gpu -c opt //bench:overlap_check_test
# //bench:graph_capture_test` (the GPU CI overlap check, timed, so optimized
# like layer_stack_bench; the layer stack's step as a CUDA graph against the
# eager step, byte for byte), copies the test
# and benchmark binaries and this script into .gpu/ (ignored by git; the
# bazel-bin symlink does not travel to the GPU machine), and prints the one
# command to run there, with .gpu carried along (docs/gpu.md).
#
# There (`--on-device`, from the repository root): runs every test binary
# (the overlap check and the graph capture test included; their OVERLAP_*
# and GRAPH_CAPTURE_* environment passes through), then compute-sanitizer
# memcheck, racecheck and synccheck on the conformance, backend, graph,
# pipeline and budget tests, the graph capture test (smaller: hidden 512,
# 1024 tokens) and a quick benchmark run, then the copy benchmark.
# Logs go to $OUT (at most 8 files come back): device.txt, tests.log,
# memcheck.log, racecheck.log, synccheck.log, benchmark.log, benchmark.md,
# summary.txt. Exits non-zero if any step failed.
set -uo pipefail

BINARIES=(cuda_smoke_test pinned_arena_test cuda_conformance_test
          cuda_backend_test cuda_graph_test cuda_pipeline_test
          cuda_budget_test)
# Built from bench/ with the binaries above (fastbuild).
BENCH_BINARIES=(cuda_copy_benchmark)
# Built from bench/ with -c opt (its own output folder: the binaries above
# stay fastbuild).
BENCH_TESTS=(overlap_check_test graph_capture_test)

build_here() {
  set -e
  cd "$(dirname "$0")/../.."
  local targets=(//backends/cuda:all)
  for b in "${BENCH_BINARIES[@]}"; do targets+=("//bench:$b"); done
  bazel build --config=gpu "${targets[@]}"
  local bin
  bin="$(bazel info --config=gpu bazel-bin 2>/dev/null)"
  mkdir -p .gpu
  for b in "${BINARIES[@]}"; do
    cp -f "$bin/backends/cuda/$b" .gpu/
  done
  for b in "${BENCH_BINARIES[@]}"; do
    cp -f "$bin/bench/$b" .gpu/
  done
  targets=()
  for b in "${BENCH_TESTS[@]}"; do targets+=("//bench:$b"); done
  bazel build --config=gpu -c opt "${targets[@]}"
  bin="$(bazel info --config=gpu -c opt bazel-bin 2>/dev/null)"
  for b in "${BENCH_TESTS[@]}"; do
    cp -f "$bin/bench/$b" .gpu/
  done
  cp -f backends/cuda/run_on_gpu.sh .gpu/
  chmod -R u+w .gpu
  echo
  echo "Copied to .gpu/: ${BINARIES[*]} ${BENCH_BINARIES[*]} ${BENCH_TESTS[*]} run_on_gpu.sh ($(du -sh .gpu | cut -f1))"
  echo "On the GPU machine (run tool, carry [\".gpu\"]):"
  echo
  echo "  bash .gpu/run_on_gpu.sh --on-device"
}

on_device() {
  local out="${OUT:-/tmp/gpu_out}"
  local dir
  dir="$(cd "$(dirname "$0")" && pwd)"
  mkdir -p "$out"
  local sanitizer
  sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  local summary="$out/summary.txt"
  local failures=0
  # The sanitizer steps stop being started after this many seconds, so that
  # the benchmark still fits in the run's limit.
  local sanitizer_deadline="${SANITIZER_DEADLINE_S:-400}"
  : >"$summary"

  {
    nvidia-smi
    nvidia-smi --query-gpu=name,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,driver_version,memory.total --format=csv
    uname -a
    "$sanitizer" --version
  } >"$out/device.txt" 2>&1

  # step NAME LOG TIMEOUT COMMAND...: runs COMMAND with its output appended to
  # LOG and records the exit status (and a sanitizer's ERROR SUMMARY).
  step() {
    local name="$1" log="$2" limit="$3"
    shift 3
    local start=$SECONDS
    echo "===== $name: $*" >>"$log"
    timeout --kill-after=10 "$limit" "$@" >>"$log.part" 2>&1
    local rc=$?
    cat "$log.part" >>"$log"
    local errors
    errors="$(grep -hE "(ERROR|RACECHECK) SUMMARY" "$log.part" | tail -1)"
    rm -f "$log.part"
    local verdict="ok"
    if [[ $rc -ne 0 ]]; then
      verdict="FAILED rc=$rc"
      [[ $rc -eq 124 || $rc -eq 137 ]] && verdict="TIMED OUT after ${limit}s"
      failures=$((failures + 1))
    fi
    printf '%-58s %-20s %4ss %s\n' "$name" "$verdict" $((SECONDS - start)) \
      "$errors" | tee -a "$summary"
  }

  # 1. The tests, then the overlap check (bench/overlap_check_test.cc: copies
  # beside GEMMs >= 90% per direction, step <= 1.25x the limit, bytes equal).
  for t in cuda_smoke_test pinned_arena_test cuda_conformance_test \
           cuda_backend_test cuda_graph_test cuda_pipeline_test \
           cuda_budget_test; do
    step "$t" "$out/tests.log" 300 "$dir/$t"
  done
  step "overlap_check_test" "$out/tests.log" 240 "$dir/overlap_check_test"
  grep -h "OVERLAP_SUMMARY" "$out/tests.log" | tail -1 | tee -a "$summary"
  # The layer stack's step captured as a CUDA graph (bench/graph_capture_test.cc:
  # every output and gradient byte of three launches equal to the eager
  # step's; less graph memory than without offloading).
  step "graph_capture_test" "$out/tests.log" 240 "$dir/graph_capture_test"
  grep -h "GRAPH_CAPTURE_SUMMARY" "$out/tests.log" | tail -2 | tee -a "$summary"

  # 2. compute-sanitizer. The backend test runs in three parts: its error
  # tests make CUDA calls fail on purpose (API error reporting off for them),
  # and its held-stream tests block a stream with a host function (run apart
  # so that a tool that serializes streams costs only that part). The graph
  # test runs in two: its error tests end an unjoined capture on purpose.
  local held='CudaBackendHeldStreamTest.*'
  local errors='CudaBackendErrorTest.*'
  local graph_errors='CudaGraphErrorTest.*'
  for tool in memcheck racecheck synccheck; do
    local log="$out/$tool.log"
    local extra=()
    [[ $tool == memcheck ]] && extra=(--leak-check full)
    local cs=("$sanitizer" --tool "$tool" --error-exitcode 99 "${extra[@]}")
    local parts=(
      "conformance|${cs[*]} $dir/cuda_conformance_test --gtest_filter=-*Unjoined*"
      "conformance unjoined capture (api errors not reported)|${cs[*]} --report-api-errors no $dir/cuda_conformance_test --gtest_filter=*Unjoined*"
      "backend|${cs[*]} $dir/cuda_backend_test --gtest_filter=-$held:$errors"
      "backend held streams|${cs[*]} $dir/cuda_backend_test --gtest_filter=$held"
      "backend errors (api errors not reported)|${cs[*]} --report-api-errors no $dir/cuda_backend_test --gtest_filter=$errors"
      "graph|${cs[*]} $dir/cuda_graph_test --gtest_filter=-$graph_errors"
      "graph errors (api errors not reported)|${cs[*]} --report-api-errors no $dir/cuda_graph_test --gtest_filter=$graph_errors"
      "pipeline|${cs[*]} $dir/cuda_pipeline_test"
      "budget|${cs[*]} $dir/cuda_budget_test"
    )
    # The layer-stack graph test runs cuBLAS. racecheck checks shared memory
    # inside each kernel, and flags cuBLAS's own sm90 GEMM kernels (nvjet_*;
    # all 100 reports displayed of 968, H200, 2026-11-23): nothing about our
    # stream ordering, which memcheck and synccheck cover. So not racecheck.
    [[ $tool != racecheck ]] && parts+=(
      "graph capture (layer stack, hidden 512)|env GRAPH_CAPTURE_HIDDEN=512 GRAPH_CAPTURE_TOKENS=1024 ${cs[*]} $dir/graph_capture_test"
    )
    parts+=(
      "benchmark --quick|${cs[*]} $dir/cuda_copy_benchmark --quick"
    )
    for part in "${parts[@]}"; do
      local name="${part%%|*}" cmd="${part#*|}"
      if (( SECONDS > sanitizer_deadline )); then
        printf '%-58s %s\n' "$tool: $name" "SKIPPED (time)" | tee -a "$summary"
        failures=$((failures + 1))
        continue
      fi
      # shellcheck disable=SC2086
      step "$tool: $name" "$log" 150 $cmd
    done
  done

  # 3. The copy benchmark.
  step "cuda_copy_benchmark" "$out/benchmark.log" 240 \
    "$dir/cuda_copy_benchmark" --out "$out/benchmark.md"

  echo
  echo "== summary ($failures failed) =="
  cat "$summary"
  echo
  cat "$out/benchmark.md" 2>/dev/null
  return $((failures > 0))
}

case "${1:-}" in
  --on-device) on_device ;;
  "") build_here ;;
  *) echo "usage: $0 [--on-device]" >&2; exit 2 ;;
esac
