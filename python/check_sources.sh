#!/usr/bin/env bash
# //python:sources_list_test: actoffload/sources.txt, the one list of C++
# files that setup.py (pip install) and actoffload/_build.py (the build at
# first import) compile, must name every non-test .cc of Bazel's filegroups
# //engine:sources, //engine/budget:sources, //engine/core:sources,
# //engine/layer:sources, //engine/pipeline:sources, //engine/plan:sources,
# //engine/policy:sources, //backends/sim:sources (this test's data), of
# python/actoffload/csrc/ and of backends/cuda/, and nothing else; every
# file it names must exist.
#
# backends/cuda has no filegroup visible to //python, so its files are looked
# up in the checkout that the list file's runfiles link points into. Also runs
# outside Bazel: bash python/check_sources.sh
set -euo pipefail
if [[ -n "${TEST_SRCDIR:-}" ]]; then
  root="$TEST_SRCDIR/${TEST_WORKSPACE:-__main__}"
else
  root="$(cd "$(dirname "$0")/.." && pwd)"
fi
cd "$root"
list=python/actoffload/sources.txt
checkout="$(dirname "$(dirname "$(dirname "$(readlink -f "$list")")")")"

# Listed paths, "cuda:" prefixes kept aside.
listed=$(sed -e 's/#.*//' -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' "$list" |
  grep -v '^$' || true)
paths=$(sed -e 's/^cuda:[[:space:]]*//' <<<"$listed" | sort)

failures=0
fail() { echo "sources_list_test: $*" >&2; failures=$((failures + 1)); }

if dups=$(uniq -d <<<"$paths") && [[ -n "$dups" ]]; then
  fail "listed twice in $list: $dups"
fi

# What Bazel has: the filegroups' .cc files (in this test's runfiles), the
# binding's, and the CUDA backend's in the checkout.
expected=$( {
  find engine backends/sim python/actoffload/csrc -name '*.cc' ! -name '*_test.cc'
  if [[ -d "$checkout/backends/cuda" ]]; then
    (cd "$checkout" && find backends/cuda -maxdepth 1 -name '*.cc' ! -name '*_test.cc')
  else
    echo "sources_list_test: no checkout at $checkout; backends/cuda not compared" >&2
  fi
} | sort)
if [[ -z "$(grep '^engine/' <<<"$expected" || true)" ]]; then
  fail "no engine/*.cc in $root: is the test's data missing?"
fi

while read -r path; do
  [[ -n "$path" ]] || continue
  fail "$path is compiled by Bazel's filegroups but missing from $list"
done < <(comm -23 <(echo "$expected") <(echo "$paths"))

while read -r path; do
  [[ -n "$path" ]] || continue
  if [[ -f "$path" || -f "$checkout/$path" ]]; then
    fail "$path is in $list but in none of the filegroups (or is a test)"
  else
    fail "$path is in $list but does not exist"
  fi
done < <(comm -13 <(echo "$expected") <(echo "$paths"))

# The CUDA backend only in the CUDA build; the engine and simulator always.
while read -r line; do
  case "$line" in
    cuda:*) [[ "$line" =~ ^cuda:[[:space:]]*(backends/cuda/|python/actoffload/csrc/) ]] ||
              fail "'$line': only backends/cuda and the binding may be CUDA-only" ;;
    backends/cuda/*) fail "'$line' needs the cuda: prefix (CUDA-only)" ;;
  esac
done <<<"$listed"

if ((failures > 0)); then
  echo "sources_list_test: FAILED ($failures problem(s)); edit $list" >&2
  exit 1
fi
echo "sources_list_test: $list names the $(wc -l <<<"$paths") .cc files Bazel has"
