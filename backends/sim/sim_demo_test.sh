#!/bin/bash
# The demo runs, verifies its bytes, finds no hazard, and rejects bad flags.
set -euo pipefail
demo="$TEST_SRCDIR/activation_offload/backends/sim/sim_demo"
out=$("$demo" --layers=4 --mib_per_layer=8 --compute_us=100)
echo "$out"
grep -q "reloaded bytes      identical" <<<"$out"
grep -q "hazards             0" <<<"$out"
grep -q "^L3 " <<<"$out"
if "$demo" --no_such_flag=1 2>/dev/null; then
  echo "an unknown flag was accepted" >&2
  exit 1
fi
