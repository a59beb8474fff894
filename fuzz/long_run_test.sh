#!/usr/bin/env bash
# fuzz/long_run.sh starts the long-run target of fuzz/BUILD that it names,
# with the time and options given: a stub `bazel` on PATH records the call
# instead of running it, and the named target must be one this test's
# runfiles hold (fuzz/BUILD lists the long-run targets as its data).
set -euo pipefail

fail() {
  echo "long_run_test: FAIL: $*" >&2
  exit 1
}

stub=$TEST_TMPDIR/bin
mkdir -p "$stub"
cat >"$stub/bazel" <<'STUB'
#!/usr/bin/env bash
printf '%s\n' "$PWD" "$@" >"$TEST_TMPDIR/bazel_call"
STUB
chmod +x "$stub/bazel"

check() {  # check EXPECTED_TARGET EXPECTED_ARGS... -- LONG_RUN_ARGS...
  local target=$1
  shift
  local expected=()
  while [[ $1 != -- ]]; do expected+=("$1"); shift; done
  shift
  rm -f "$TEST_TMPDIR/bazel_call"
  PATH=$stub:$PATH fuzz/long_run.sh "$@" || fail "long_run.sh $* exited $?"
  mapfile -t call <"$TEST_TMPDIR/bazel_call"
  [[ ${call[1]} == run && ${call[2]} == "//fuzz:$target" && ${call[3]} == -- ]] ||
    fail "long_run.sh $* ran: bazel ${call[*]:1}"
  [[ "${call[*]:4}" == "${expected[*]}" ]] ||
    fail "long_run.sh $* passed '${call[*]:4}', expected '${expected[*]}'"
  # Run from the workspace root (here: the runfiles root).
  [[ -f ${call[0]}/fuzz/BUILD || -f ${call[0]}/fuzz/long_run.sh ]] ||
    fail "long_run.sh $* ran bazel in ${call[0]}, not the workspace root"
  [[ -x fuzz/$target ]] || fail "//fuzz:$target is not a target of fuzz/BUILD"
}

check offload_fuzz --seconds=600 -- 
check offload_fuzz --seconds=600 -- offload
check pipeline_fuzz --seconds=30 --jobs=1 --seed=5 -- pipeline 30 --jobs=1 --seed=5
if PATH=$stub:$PATH fuzz/long_run.sh nonsense 2>/dev/null; then
  fail "long_run.sh nonsense should fail"
fi
if PATH=$stub:$PATH fuzz/long_run.sh offload ten 2>/dev/null; then
  fail "long_run.sh offload ten should fail"
fi
echo "long_run_test: PASS"
