#!/usr/bin/env bash
# The one fuzz script (docs/testing.md, "Fuzzing"): builds a libFuzzer target
# with clang (-fsanitize=fuzzer,address,undefined) from the source files
# given as arguments, runs every seed input once, then fuzzes a copy of the
# seed corpus. Nothing lists sources by hand: fuzz/BUILD passes the
# packages' `fuzz_sources` filegroups, both to CI's tests
# (//fuzz:offload_fuzz_test, //fuzz:pipeline_fuzz_test: a count-bounded run)
# and to the long runs (//fuzz:offload_fuzz, //fuzz:pipeline_fuzz, which
# fuzz/long_run.sh starts with `bazel run`: a time-bounded run).
#
# The engine is compiled once, into an archive, by //fuzz:sanitized_engine
# (fuzz.sh --archive=OUT SOURCE...); each target then compiles only its
# harness and links that archive whole.
#
# Usage: fuzz.sh --archive=OUT SOURCE...
#   compiles every .cc among the sources for fuzzing
#   (-fsanitize=fuzzer-no-link,address,undefined) into the archive OUT, and
#   stops
# Usage: fuzz.sh NAME CORPUS_DIR SOURCE... [OPTION...]
#   SOURCE        the harness's .cc and .h files and archives (.a) made by
#                 --archive
#   --runs=N      stop after N executions, one process, fixed libFuzzer seed:
#                 the same result on any machine (CI)
#   --seconds=S   fuzz for S seconds of wall time on --jobs processes
#   --jobs=J      parallel fuzzing processes with --seconds (default 2);
#                 each picks a fresh random seed unless --seed is given
#   --seed=N      libFuzzer's -seed (default 1 with --runs, fresh with
#                 --seconds; 0 = fresh)
#   --out=DIR     where the binary, the corpus copy, the logs and any crash
#                 input go (default: $TEST_TMPDIR under Bazel's test runner,
#                 else ${TMPDIR:-/tmp}/fuzz_long_run/NAME)
# Environment (overrides the options, e.g. bazel test --test_env=...):
#   OFFLOAD_FUZZ_RUNS, OFFLOAD_FUZZ_SECONDS, OFFLOAD_FUZZ_JOBS,
#   OFFLOAD_FUZZ_SEED, OFFLOAD_FUZZ_CXX (default clang++).
# Exit status: 0 when every seed and the fuzzing ran clean; 1 otherwise
# (the crash input and how to replay it are printed).
set -euo pipefail

fail() {
  echo "fuzz.sh: FAIL: $*" >&2
  exit 1
}

runs=""
seconds=""
jobs=2
seed=""
out=""
archive=""
positional=()
for arg in "$@"; do
  case $arg in
    --runs=*) runs=${arg#*=}; seconds="" ;;
    --seconds=*) seconds=${arg#*=}; runs="" ;;
    --jobs=*) jobs=${arg#*=} ;;
    --seed=*) seed=${arg#*=} ;;
    --out=*) out=${arg#*=} ;;
    --archive=*) archive=${arg#*=} ;;
    --*) fail "unknown option $arg (see the usage at the top of fuzz/fuzz.sh)" ;;
    *) positional+=("$arg") ;;
  esac
done
if [[ -n ${OFFLOAD_FUZZ_RUNS:-} ]]; then runs=$OFFLOAD_FUZZ_RUNS; seconds=""; fi
if [[ -n ${OFFLOAD_FUZZ_SECONDS:-} ]]; then seconds=$OFFLOAD_FUZZ_SECONDS; runs=""; fi
jobs=${OFFLOAD_FUZZ_JOBS:-$jobs}
seed=${OFFLOAD_FUZZ_SEED:-$seed}
cxx=${OFFLOAD_FUZZ_CXX:-clang++}
flags=(-std=c++20 -O1 -gline-tables-only -fno-omit-frame-pointer
       -fno-sanitize-recover=all -I.)
link_flags=(-fsanitize=fuzzer,address,undefined)
# Objects for a fuzz target, not its main: the same coverage counters and
# sanitizers, libFuzzer linked only by the target.
object_flags=(-fsanitize=fuzzer-no-link,address,undefined)

command -v "$cxx" >/dev/null ||
  fail "$cxx not found: run ./setup.sh (it installs clang and libclang-rt-14-dev)"

# compile OBJ_DIR JOBS SOURCE...: every .cc among the sources, not tests.
compile() {
  local obj=$1 build_jobs=$2
  shift 2
  rm -rf "$obj"
  mkdir -p "$obj"
  printf '%s\n' "$@" | grep '\.cc$' | grep -v '_test\.cc$' |
    xargs -r -P "$build_jobs" -I{} sh -c \
      'o="$1/$(echo "$2" | tr / _).o"; shift 2; "$@" -c "$0" -o "$o"' \
      {} "$obj" {} "$cxx" "${flags[@]}" "${object_flags[@]}"
}

if [[ -n $archive ]]; then
  ((${#positional[@]} >= 1)) || fail "usage: fuzz.sh --archive=OUT SOURCE..."
  start=$SECONDS
  obj=$(mktemp -d "${TMPDIR:-/tmp}/sanitized_engine.XXXXXX")
  compile "$obj" "$(nproc 2>/dev/null || echo 2)" "${positional[@]}" ||
    fail "compiling the engine for fuzzing failed"
  rm -f "$archive"
  ar rcs "$archive" "$obj"/*.o || fail "archiving $archive failed"
  rm -rf "$obj"
  echo "fuzz.sh: compiled the engine for fuzzing into $archive in $((SECONDS - start)) s"
  exit 0
fi

((${#positional[@]} >= 3)) || fail "usage: fuzz.sh NAME CORPUS_DIR SOURCE... [OPTION...]"
name=${positional[0]}
corpus_dir=${positional[1]}
sources=("${positional[@]:2}")
[[ -n $runs || -n $seconds ]] || fail "give --runs=N or --seconds=S"
[[ -d $corpus_dir ]] || fail "no corpus directory $corpus_dir"

# A count-bounded run is one process with a fixed seed, so that it does the
# same executions everywhere; a time-bounded one may use every core.
if [[ -n $runs ]]; then
  jobs=1
  seed=${seed:-1}
elif ((jobs > 1)) && [[ -n $seed && $seed != 0 ]]; then
  fail "--seed=$seed would give all $jobs jobs the same seed: add --jobs=1"
fi
if [[ -n ${TEST_TMPDIR:-} ]]; then
  work=${out:-$TEST_TMPDIR}
  artifacts=${TEST_UNDECLARED_OUTPUTS_DIR:-$work}
  build_jobs=2  # the tests are tagged cpu:2
else
  work=${out:-${TMPDIR:-/tmp}/fuzz_long_run/$name}
  artifacts=$work
  build_jobs=$(nproc 2>/dev/null || echo 2)
fi
mkdir -p "$work" "$artifacts"
work=$(cd "$work" && pwd)
artifacts=$(cd "$artifacts" && pwd)
binary=$work/${name}_fuzz
echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' \
  >"$work/probe.cc"
"$cxx" "${flags[@]}" "${link_flags[@]}" "$work/probe.cc" -o "$work/probe" 2>"$work/probe.log" || {
  cat "$work/probe.log" >&2
  fail "$cxx cannot link -fsanitize=fuzzer,address,undefined: install libclang-rt-14-dev (./setup.sh)"
}

# Build: the harness's .cc files, linked with the archives among the sources
# (the whole of each: nothing of the engine is left out).
start=$SECONDS
compile "$work/obj" "$build_jobs" "${sources[@]}" ||
  fail "compiling the $name fuzz target failed"
archives=()
for f in "${sources[@]}"; do
  [[ $f == *.a ]] && archives+=("$f")
done
"$cxx" "${flags[@]}" "${link_flags[@]}" "$work"/obj/*.o \
  -Wl,--whole-archive "${archives[@]}" -Wl,--no-whole-archive -o "$binary" ||
  fail "linking the $name fuzz target failed"
echo "fuzz.sh: $name: built $binary in $((SECONDS - start)) s"

replay_help() {
  echo "  replay: $binary INPUT   (OFFLOAD_FUZZ_VERBOSE=1 prints every call)" >&2
  echo "  shrink: $binary -minimize_crash=1 -runs=20000 INPUT" >&2
}

# Every seed once (a regression run); crash-* inputs are findings not fixed
# yet, left out.
seeds=()
for f in "$corpus_dir"/*; do
  [[ -f $f && $(basename "$f") != crash-* ]] && seeds+=("$f")
done
((${#seeds[@]} > 0)) || fail "no seed inputs in $corpus_dir"
"$binary" -rss_limit_mb=2048 "${seeds[@]}" >"$work/seeds.log" 2>&1 || {
  cat "$work/seeds.log" >&2
  replay_help
  fail "a seed input of $corpus_dir fails (above)"
}
echo "fuzz.sh: $name: ${#seeds[@]} seed inputs ran clean"

# Then fuzz a copy of the seed corpus.
rm -rf "$work/corpus" "$work/logs"
mkdir -p "$work/corpus" "$work/logs"
cp "${seeds[@]}" "$work/corpus/"
fuzz_flags=(-rss_limit_mb=2048 -max_len=1024 -timeout=20 -print_final_stats=1
            -artifact_prefix="$artifacts/")
[[ -n $seed ]] && fuzz_flags+=(-seed="$seed")
# A count-bounded run repeats exactly only without what depends on time or
# addresses: libFuzzer re-reads its corpus directory every second (-reload),
# and the code under test takes paths that depend on heap addresses
# (pointer-ordered containers), so ASLR is turned off for it when the
# machine allows (setarch -R); otherwise the run may differ slightly.
norandom=()
if [[ -n $runs ]]; then
  fuzz_flags+=(-reload=0)
  if setarch "$(uname -m)" -R true 2>/dev/null; then
    norandom=(setarch "$(uname -m)" -R)
  else
    echo "fuzz.sh: $name: note: cannot turn ASLR off here (setarch -R);" \
      "the run may differ slightly from one on another machine"
  fi
fi
# Findings of this run: inputs libFuzzer writes from now on.
touch "$work/logs/start"
findings() {
  find "$artifacts" -maxdepth 1 -newer "$work/logs/start" \( -name 'crash-*' \
    -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \)
}
status=0
fuzz_start=$SECONDS
if [[ -n $runs ]]; then
  echo "fuzz.sh: $name: fuzzing $runs executions, seed $seed"
  # The whole output goes to the log; the test log gets all but the
  # NEW/REDUCE lines.
  set +e
  "${norandom[@]}" "$binary" "${fuzz_flags[@]}" -runs="$runs" "$work/corpus" 2>&1 |
    tee "$work/logs/fuzz-0.log" | grep -v '^#[0-9]*.*\(NEW\|REDUCE\)'
  status=${PIPESTATUS[0]}
  set -e
else
  echo "fuzz.sh: $name: fuzzing for $seconds s on $jobs process(es)," \
    "seed ${seed:-fresh per process}; logs in $work/logs"
  if ((jobs == 1)); then
    "$binary" "${fuzz_flags[@]}" -max_total_time="$seconds" "$work/corpus" \
      >"$work/logs/fuzz-0.log" 2>&1 || status=$?
  else
    # libFuzzer writes fuzz-<job>.log into the current directory.
    (cd "$work/logs" &&
      "$binary" "${fuzz_flags[@]}" -max_total_time="$seconds" \
        -jobs="$jobs" -workers="$jobs" "$work/corpus") || status=$?
  fi
fi

# The summary, from every process's final stats.
executions=$(cat "$work"/logs/fuzz-*.log 2>/dev/null |
  sed -n 's/^stat::number_of_executed_units: *//p' | awk '{s += $1} END {print s + 0}')
last_cov=$(grep -h '^#[0-9].*cov:' "$work"/logs/fuzz-*.log 2>/dev/null | tail -n 1 |
  sed -n 's/.*\(cov: [0-9]*\) \(ft: [0-9]*\) \(corp: [^ ]*\).*/\1 \2 \3/p')
found=$(findings)
echo "fuzz.sh: $name: $executions executions in $((SECONDS - fuzz_start)) s" \
  "on $jobs process(es) (last: ${last_cov:-n/a})"
if ((status != 0)) || [[ -n $found ]]; then
  grep -h -B2 -A40 'ERROR: \|VIOLATION\|runtime error' "$work"/logs/fuzz-*.log 2>/dev/null |
    head -n 80 >&2 || true
  echo "fuzz.sh: $name: inputs kept:" >&2
  echo "${found:-  (none written)}" >&2
  replay_help
  fail "$name: the fuzzer found a violation or crash (exit status $status); logs in $work/logs"
fi
echo "fuzz.sh: $name: PASS ($((SECONDS - start)) s in all)"
