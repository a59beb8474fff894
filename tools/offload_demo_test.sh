#!/bin/bash
# The offload demo runs a small stack with bytes checked: the timeline has a
# row per layer with copies for the offloaded ones, offloading lowers the peak
# device memory, the step-time ratio is reported, popped bytes are identical
# and no hazard is found. Bad flags are rejected.
set -euo pipefail
demo="$TEST_SRCDIR/activation_offload/tools/offload_demo"
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$demo" --layers=4 --offloaded=2 --mib_per_layer=2 --compute_us=100)
echo "$out"
grep -q "^step time ratio (offloaded / not): *[0-9]" <<<"$out" ||
  fail "no step time ratio line"
grep -q "^popped bytes: *identical" <<<"$out" || fail "bytes not identical"
grep -q "^hazards: *0$" <<<"$out" || fail "hazards found"
for layer in L0 L1 L2 L3; do
  grep -q "^$layer " <<<"$out" || fail "no timeline row for $layer"
done
# The two offloaded layers have D2H and H2D intervals; the others none.
awk '$1 == "L0" || $1 == "L1" { if ($3 == "-" || $4 == "-") exit 1 }
     $1 == "L2" || $1 == "L3" { if ($3 != "-" || $4 != "-") exit 1 }' \
  <<<"$out" || fail "copies attributed to the wrong layers"
peak_without=$(awk '/^peak device memory, no offloading:/ { print $6 }' <<<"$out")
peak_with=$(awk '/^peak device memory, 2 offloaded:/ { print $6 }' <<<"$out")
[[ -n "$peak_without" && -n "$peak_with" ]] || fail "peak lines missing"
awk -v a="$peak_with" -v b="$peak_without" 'BEGIN { exit !(a < b) }' ||
  fail "peak with offloading ($peak_with) not below without ($peak_without)"
# 4 layers of 2 MiB: 8 MiB resident without offloading, n-k = 2 layers with.
[[ "$peak_without" == "8.0" && "$peak_with" == "4.0" ]] ||
  fail "unexpected peaks: $peak_without / $peak_with MiB"

# Copies slower than compute: offloading now costs step time.
slow=$("$demo" --layers=4 --offloaded=2 --mib_per_layer=2 --compute_us=5 \
  --max_checked_mib=0)
ratio=$(awk '/^step time ratio/ { print $NF }' <<<"$slow")
awk -v r="$ratio" 'BEGIN { exit !(r > 1.0) }' ||
  fail "expected a ratio above 1 when copies dominate, got $ratio"
grep -q "^popped bytes: *not checked" <<<"$slow" || fail "timing-only run"

if "$demo" --no_such_flag=1 2>/dev/null; then fail "unknown flag accepted"; fi
if "$demo" --layers=4 --offloaded=4 2>/dev/null; then
  fail "offloaded == layers accepted"
fi
# Each bad flag: exit status 2 and a first line naming the flag, the value
# and the reason.
refused() {  # expected first line of stderr, then the demo's arguments
  local want=$1; shift
  local err status=0
  err=$("$demo" "$@" 2>&1 >/dev/null) || status=$?
  [[ $status -eq 2 ]] || fail "$* exited $status, not 2"
  [[ "$(head -1 <<<"$err")" == "$want"* ]] ||
    fail "$*: expected '$want...', got '$(head -1 <<<"$err")'"
}
refused "--layers=abc: not an integer" --layers=abc
refused "--layers=0: must be at least 1" --layers=0
refused "--offloaded=99: must be at most --layers - 1 = 7" --offloaded=99
refused "--gbps=-1: must be above 0" --gbps=-1
refused "unknown flag --no_such_flag" --no_such_flag=1
refused "--mode=pipe: --mode is layer or pipeline" --mode=pipe
refused "--offload_modules=core_atn: unknown module core_atn (the demo's layers have attn_norm," \
  --mode=pipeline --offload_modules=core_atn
refused "--pp=x: not an integer" --mode=pipeline --pp=x
# --help: the usage on stdout, exit status 0, in both modes.
help=$("$demo" --help) || fail "--help exited $?"
grep -q "^usage: demo \[--mode=layer\]" <<<"$help" || fail "no usage for --help"
help=$("$demo" --mode=pipeline --help) || fail "--mode=pipeline --help exited $?"
grep -q "^usage: demo --mode=pipeline" <<<"$help" ||
  fail "no pipeline usage for --mode=pipeline --help"
echo PASS

# Pictures: --trace_json and --svg write the last iteration of both runs
# (their contents are checked with real parsers in //timeline).
dir=$(mktemp -d)
"$demo" --layers=3 --offloaded=1 --mib_per_layer=8 --compute_us=100 \
  --trace_json="$dir/t.json" --svg="$dir/t.svg" >/dev/null
head -c 16 "$dir/t.json" | grep -q '{' || fail "no JSON written"
head -1 "$dir/t.svg" | grep -q '<?xml' || fail "no SVG written"
grep -q 'data-track="offload_d2h"' "$dir/t.svg" || fail "SVG without D2H row"
grep -q '"traceEvents"' "$dir/t.json" || fail "JSON without traceEvents"

# --mode=pipeline: Megatron's fine-grained mode over 2 ranks (interleaved).
pipe=$("$demo" --mode=pipeline --pp=2 --vpp=2 --microbatches=4 --layers=1 \
  --tokens=64 --hidden=128 --ffn=512 --min_offload_elements=4096 \
  --offload_modules=core_attn,moe_act --delta_mib=0)
echo "$pipe"
for rank in 0 1; do
  line=$(awk -v r="$rank" '$1 == r && NF == 7' <<<"$pipe")
  [[ -n "$line" ]] || fail "no report line for rank $rank"
  awk '{ exit !($3 < $2 && $6 == "identical" && $7 == 0) }' <<<"$line" ||
    fail "rank $rank: peak not lower, bytes wrong or hazards: $line"
done
grep -q "^| PP rank | qkv_linear | core_attn " <<<"$pipe" ||
  fail "no summary table"
awk -F'|' '$2 ~ /^ *[01] *$/ { if ($3 + 0 != 0 || $4 + 0 <= 0) exit 1 }' \
  <<<"$pipe" || fail "summary: qkv_linear must be 0 MB, core_attn above 0"
if "$demo" --mode=pipeline --vpp=2 --pp=3 --microbatches=4 2>/dev/null; then
  fail "microbatches not a multiple of pp accepted with vpp > 1"
fi
if "$demo" --mode=nonsense 2>/dev/null; then fail "unknown mode accepted"; fi
