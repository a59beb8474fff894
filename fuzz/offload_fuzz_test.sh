#!/usr/bin/env bash
# Builds the offload fuzz target with clang (libFuzzer + ASan + UBSan) from
# the sources given as arguments, runs every seed input once, then fuzzes
# for OFFLOAD_FUZZ_SECONDS (default 60) from a copy of the seed corpus.
# Usage: offload_fuzz_test.sh CORPUS_DIR SOURCE...
set -euo pipefail

corpus_dir=$1
shift
cxx=${OFFLOAD_FUZZ_CXX:-clang++}
seconds=${OFFLOAD_FUZZ_SECONDS:-60}
work=${TEST_TMPDIR:-$(mktemp -d)}
artifacts=${TEST_UNDECLARED_OUTPUTS_DIR:-$work}
flags=(-std=c++20 -O1 -gline-tables-only -fno-omit-frame-pointer
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I.)

fail() {
  echo "offload_fuzz_test: FAIL: $*" >&2
  exit 1
}

command -v "$cxx" >/dev/null ||
  fail "$cxx not found: run ./setup.sh (it installs clang and libclang-rt-14-dev)"
echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' \
  >"$work/probe.cc"
"$cxx" "${flags[@]}" "$work/probe.cc" -o "$work/probe" 2>"$work/probe.log" || {
  cat "$work/probe.log" >&2
  fail "$cxx cannot link -fsanitize=fuzzer,address,undefined: install libclang-rt-14-dev (./setup.sh)"
}

start=$SECONDS
mkdir -p "$work/obj"
printf '%s\n' "$@" | grep '\.cc$' | grep -v '_test\.cc$' |
  xargs -P 2 -I{} sh -c 'o="$1/obj/$(echo "$2" | tr / _).o"; shift 2; "$@" -c "$0" -o "$o"' \
    {} "$work" {} "$cxx" "${flags[@]}" ||
  fail "compiling the fuzz target failed"
"$cxx" "${flags[@]}" "$work"/obj/*.o -o "$work/offload_fuzz" ||
  fail "linking the fuzz target failed"
echo "offload_fuzz_test: built in $((SECONDS - start)) s"

# Every seed once (a regression run), then a bounded fuzzing run.
seeds=("$corpus_dir"/*)
"$work/offload_fuzz" -rss_limit_mb=2048 "${seeds[@]}" ||
  fail "a seed input fails (above)"
mkdir -p "$work/corpus"
cp "${seeds[@]}" "$work/corpus/"
# A fixed seed keeps CI deterministic (OFFLOAD_FUZZ_SEED=0: a random one).
"$work/offload_fuzz" -max_total_time="$seconds" -rss_limit_mb=2048 \
  -seed="${OFFLOAD_FUZZ_SEED:-1}" \
  -max_len=1024 -timeout=20 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" "$work/corpus" ||
  fail "the fuzzer found a violation or crash; the input is in $artifacts (bazel-testlogs/fuzz/offload_fuzz_test/test.outputs)"
echo "offload_fuzz_test: PASS ($((SECONDS - start)) s)"
