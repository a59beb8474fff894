# Sourced by the GPU scripts (run_on_gpu.sh, run_distributed_on_gpu.sh),
# from the repository root with `out` set: the environment both need and
# step(), which runs one command with its output in $out/NAME.txt, appends
# its exit status, time and last lines to $out/summary.txt, and sets
# status=1 when it fails.
mkdir -p "$out"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export ACTOFFLOAD_BUILD_DIR="${ACTOFFLOAD_BUILD_DIR:-$PWD/python/build}"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
export CUBLAS_WORKSPACE_CONFIG=:4096:8
status=0
step() {  # name, command...
  local name=$1; shift
  echo "== $name: $*" | tee -a "$out/summary.txt"
  local start=$SECONDS
  "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - start)) s" | tee -a "$out/summary.txt"
  tail -n 3 "$out/$name.txt" | sed 's/^/   /' | tee -a "$out/summary.txt"
  [[ $rc -eq 0 ]] || status=1
}
