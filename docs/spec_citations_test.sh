#!/usr/bin/env bash
# //:spec_citations_test: every SPEC citation in the repository names a
# section, item or part of docs/spec.md (docs/spec_citations_test.py says what
# it reads). Needs only /usr/bin/python3, no third-party module.
set -euo pipefail
# Bazel runs it from the workspace's runfiles (the files it checks).
cd "${TEST_SRCDIR:?run it with bazel test}/${TEST_WORKSPACE:?}"
exec /usr/bin/python3 docs/spec_citations_test.py "$@"
