#!/usr/bin/env bash
# Issue 21 item 6 on the GPU: pipeline_bench's 1F1B (rank 0 of 2, 4
# microbatches) with this commit's engine (pipeline_bench) and with the
# engine before the SPEC 5.3 fix (pipeline_bench_old, same bench code),
# interleaved, plus the single-chunk table as a regression check.
set -u
dir="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-/tmp/gpu_out}"
mkdir -p "$out"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,pcie.link.gen.current,pcie.link.width.current,driver_version,memory.total --format=csv > "$out/device.txt" 2>&1
cat "$out/device.txt"
run() {  # name binary flags...
  local name=$1 bin=$2; shift 2
  local t0=$(date +%s)
  timeout 200 "$dir/$bin" --hidden=4096 --tokens=8192 --steps=5 --warmup=2 "$@" \
    > "$out/$name.md" 2> "$out/$name.log"
  echo "$name rc=$? $(( $(date +%s) - t0 )) s"
}
run m1_new pipeline_bench --layers=8
run pp2_l8_new pipeline_bench --layers=8 --pp=2 --microbatches=4
run pp2_l8_old pipeline_bench_old --layers=8 --pp=2 --microbatches=4
run pp2_l2_new pipeline_bench --layers=2 --pp=2 --microbatches=4
run pp2_l2_old pipeline_bench_old --layers=2 --pp=2 --microbatches=4
run pp2_l2_new2 pipeline_bench --layers=2 --pp=2 --microbatches=4
for f in "$out"/*.md; do echo "== $f"; grep -E "^\|" "$f" | cut -c1-200; done
