#!/usr/bin/env bash
# A long fuzz run of one target (docs/testing.md, "Fuzzing"): Bazel hands
# fuzz/fuzz.sh the engine compiled for fuzzing (//fuzz:sanitized_engine,
# from fuzz/BUILD's filegroups) and the harness (the same as CI's
# //fuzz:*_fuzz_test), fuzz.sh links the target with clang
# (-fsanitize=fuzzer,address,undefined) and fuzzes a copy of the seed corpus
# for SECONDS on --jobs processes (default 2), each with a fresh seed.
# `bazel run` releases Bazel's server before fuzzing starts, so other bazel
# commands can run meanwhile.
#
# Usage: fuzz/long_run.sh [offload|pipeline] [SECONDS] [fuzz.sh option...]
#   offload   the layer-mode Offloader (k-of-n, tables, manual, byte budget)
#   pipeline  the fine-grained PipelineOffloader
#   SECONDS   default 600
#   options   --jobs=J, --seed=N, --out=DIR (fuzz/fuzz.sh's usage)
# The binary, the corpus copy, the logs and any crash input land in
# ${TMPDIR:-/tmp}/fuzz_long_run/<target>/ (or --out); the last line says how
# many executions ran, and on a finding how to replay it.
set -euo pipefail

usage() {
  sed -n 's/^# \{0,1\}//; /^Usage:/,/^The binary/p' "$0" | sed '$d' >&2
  exit 2
}

target=${1:-offload}
seconds=${2:-600}
shift $(($# < 2 ? $# : 2))
case $target in
  offload | pipeline) ;;
  *) usage ;;
esac
[[ $seconds =~ ^[0-9]+$ ]] || usage

cd "$(dirname "$0")/.."
exec bazel run "//fuzz:${target}_fuzz" -- --seconds="$seconds" "$@"
