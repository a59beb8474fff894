#!/usr/bin/env bash
# Installs what building and testing this project needs on a fresh Debian 12
# machine: Bazel 4 (Debian's bazel-bootstrap), a C++20 compiler, GoogleTest,
# GoogleMock, RapidCheck, Google Benchmark, clang with its libFuzzer and
# sanitizer runtimes (for //fuzz:offload_fuzz_test), nlohmann/json and
# TinyXML-2 (the timeline tool and its test), GLPK (the linear program of
# //bench:limit, docs/limit.md), CPU PyTorch with its headers, pybind11,
# ninja and pytest (//python:python_test builds the PyTorch package with
# torch.utils.cpp_extension), OpenBLAS (Debian's torch calls whichever BLAS
# the alternatives system provides; without it, the reference BLAS: a
# 64x256 linear took 0.96 ms instead of 0.074, and the Python tests 314 s
# instead of 142; serial, as the tests' matrices are small), pip, setuptools
# and wheel (`pip install --no-build-isolation ./python` builds with them,
# offline). Idempotent: packages already
# present are not touched, and nothing is downloaded when all are there.
set -euo pipefail

packages=(
  bazel-bootstrap
  g++
  libgtest-dev
  libgmock-dev
  librapidcheck-dev
  libbenchmark-dev
  clang
  libclang-rt-14-dev
  nlohmann-json3-dev
  libtinyxml2-dev
  libglpk-dev
  python3-dev
  python3-torch
  libopenblas0-serial
  libtorch-dev
  pybind11-dev
  ninja-build
  python3-pytest
  python3-pip
  python3-setuptools
  python3-wheel
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null |
      grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if ((${#missing[@]} > 0)); then
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
  echo "setup: installing ${missing[*]}" >&2
  "${sudo[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q "${missing[@]}"
fi
echo "setup: all packages present" >&2
