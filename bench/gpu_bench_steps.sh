# Sourced by the GPU benchmark scripts (run_gpu_bench.sh, run_pipeline_bench.sh)
# for the steps both take; each script keeps only its own runs.
#
# Build machine: pack_for_device BINARY FOLDER SCRIPT builds
# `bazel build --config=gpu -c opt //bench:BINARY`, copies the binary, the
# script (bench/SCRIPT) and this file into .gpu/FOLDER/ (ignored by git; the
# bazel-bin symlink does not travel), and prints the one command for the
# `run` tool (kind "nvidia-h200", carry [".gpu/FOLDER"]).
#
# GPU machine: start_device sets out ($OUT, else /tmp/gpu_out) and dir (the
# script's folder), records the device in $out/device.txt and starts
# nvidia-smi writing SM clock, power and temperature to $out/clocks.csv every
# 200 ms (do the GEMMs run at one speed with and without copies beside
# them?); stop_clocks stops it.
#
# gpu_bench_main "$@" runs build_here with no argument and the script's
# on_device with `--on-device`, and refuses anything else.

pack_for_device() {  # binary, folder, script
  local binary=$1 folder=$2 script=$3
  set -e
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  bazel build --config=gpu -c opt "//bench:$binary"
  local bin
  bin="$(bazel info --config=gpu -c opt bazel-bin 2>/dev/null)"
  mkdir -p ".gpu/$folder"
  cp -f "$bin/bench/$binary" "bench/$script" bench/gpu_bench_steps.sh ".gpu/$folder/"
  chmod -R u+w ".gpu/$folder"
  echo
  echo "Copied to .gpu/$folder/: $binary $script gpu_bench_steps.sh ($(du -sh ".gpu/$folder" | cut -f1))"
  echo "On the GPU machine (run tool, kind \"nvidia-h200\", carry [\".gpu/$folder\"]):"
  echo
  echo "  bash .gpu/$folder/$script --on-device"
}

start_device() {
  out="${OUT:-/tmp/gpu_out}"
  dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
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
  smi=$!
}

stop_clocks() {
  kill "$smi" 2>/dev/null
  wait "$smi" 2>/dev/null
}

gpu_bench_main() {
  case "${1:-}" in
    --on-device) on_device ;;
    "") build_here ;;
    *) echo "usage: $0 [--on-device]" >&2; exit 2 ;;
  esac
}
