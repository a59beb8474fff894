#!/usr/bin/env bash
# //:include_layers_test: no #include runs back up a layer (the layers are
# listed in docs/include_layers_test.py). Needs only /usr/bin/python3.
set -euo pipefail
# Bazel runs it from the workspace's runfiles, whose links lead back to the
# source tree, which it walks.
cd "${TEST_SRCDIR:?run it with bazel test}/${TEST_WORKSPACE:?}"
exec /usr/bin/python3 docs/include_layers_test.py "$@"
