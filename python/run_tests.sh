#!/usr/bin/env bash
# The package's tests (pytest) as one Bazel test: builds the engine into the
# extension with torch.utils.cpp_extension (CPU PyTorch is enough: the
# simulated GPU stands in for CUDA) and runs python/tests. Tests that need
# CUDA report SKIPPED there. Needs /usr/bin/python3 with torch and pytest
# (./setup.sh installs Debian's python3-torch and python3-pytest).
set -euo pipefail
# Bazel's prebuilt extension (//python:extension), named relative to the
# runfiles root where the test starts.
if [[ -n "${ACTOFFLOAD_PREBUILT:-}" ]]; then
  export ACTOFFLOAD_PREBUILT="$(realpath "$ACTOFFLOAD_PREBUILT")"
fi
cd "$(dirname "$0")"
python=/usr/bin/python3
if ! "$python" -c "import torch, pytest" 2>/dev/null; then
  echo "python_test: $python cannot import torch and pytest; run ./setup.sh" >&2
  exit 1
fi
export ACTOFFLOAD_BUILD_DIR="${TEST_TMPDIR:-$(mktemp -d)}/actoffload_build"
export ACTOFFLOAD_OPT="${ACTOFFLOAD_OPT:--O2}"  # -O1 builds 15 s faster and tests 100 s slower
export MAX_JOBS="${MAX_JOBS:-2}"
exec "$python" -m pytest -q -rs -p no:cacheprovider tests "$@"
