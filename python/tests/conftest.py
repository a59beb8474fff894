"""pytest setup: the package from this checkout, built once per run into
ACTOFFLOAD_BUILD_DIR (Bazel's test tmpdir in CI)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


def pytest_report_header(config):
    return f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}"
