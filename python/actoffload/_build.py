"""Builds the C++ engine into actoffload._C with torch.utils.cpp_extension.

The extension is the engine (engine/), the simulated GPU (backends/sim/),
the CUDA backend (backends/cuda/, only when CUDA is there) and the binding
(actoffload/csrc/), compiled from this checkout: nothing is downloaded.
`pip install --no-build-isolation ./python` compiles it once (setup.py);
otherwise the first import compiles it into a cache folder
(ACTOFFLOAD_BUILD_DIR, default ~/.cache/actoffload) and later imports load
it from there, rebuilding only what changed.
"""

import glob
import os

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# python/actoffload -> the repository root (engine/, backends/ live there).
REPO_ROOT = os.path.dirname(os.path.dirname(PACKAGE_DIR))


def _sources(root, with_cuda):
    def pick(pattern):
        return sorted(
            path for path in glob.glob(os.path.join(root, pattern), recursive=True)
            if not path.endswith("_test.cc"))

    sources = pick("engine/**/*.cc") + pick("backends/sim/*.cc")
    sources += pick("python/actoffload/csrc/session.cc")
    sources += pick("python/actoffload/csrc/bindings.cc")
    if with_cuda:
        sources += [os.path.join(root, "backends/cuda", name) for name in (
            "cuda_backend.cc", "cuda_graph.cc", "cuda_memory.cc",
            "pinned_arena.cc")]
        sources += pick("python/actoffload/csrc/torch_cuda.cc")
    return sources


def cuda_wanted():
    """Whether to build with CUDA: a CUDA build of torch, a toolkit, and not
    ACTOFFLOAD_NO_CUDA=1."""
    import torch
    from torch.utils import cpp_extension
    if os.environ.get("ACTOFFLOAD_NO_CUDA") == "1":
        return False
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def extension_args(root=REPO_ROOT, with_cuda=None):
    """name, sources and flags for cpp_extension (load or setup.py)."""
    if with_cuda is None:
        with_cuda = cuda_wanted()
    if not os.path.isdir(os.path.join(root, "engine")):
        raise ImportError(
            f"actoffload: the engine's sources are not at {root}/engine; "
            "build from a checkout of the repository (pip install "
            "--no-build-isolation ./python)")
    flags = ["-std=c++20", os.environ.get("ACTOFFLOAD_OPT", "-O2"), "-DNDEBUG"]
    if with_cuda:
        flags.append("-DACTOFFLOAD_WITH_CUDA")
    return {
        "name": "actoffload_C_cuda" if with_cuda else "actoffload_C_cpu",
        "sources": _sources(root, with_cuda),
        "extra_cflags": flags,
        "extra_include_paths": [root],
        "with_cuda": with_cuda,
    }


def load_extension(verbose=False):
    """Compiles (if needed) and imports the extension module."""
    try:
        import torch  # noqa: F401
        from torch.utils import cpp_extension
    except ImportError as error:
        raise ImportError(
            "actoffload needs PyTorch (import torch failed: %s)" % error) from error
    args = extension_args()
    build_dir = os.environ.get("ACTOFFLOAD_BUILD_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "actoffload", args["name"])
    os.makedirs(build_dir, exist_ok=True)
    os.environ.setdefault("MAX_JOBS", str(max(1, os.cpu_count() or 1)))
    extra_ldflags = []
    if args["with_cuda"]:
        extra_ldflags = ["-L" + os.path.join(cpp_extension.CUDA_HOME, "lib64"),
                         "-lcudart"]
    return cpp_extension.load(
        name=args["name"], sources=args["sources"],
        extra_cflags=args["extra_cflags"],
        extra_include_paths=args["extra_include_paths"]
        + ([os.path.join(cpp_extension.CUDA_HOME, "include")]
           if args["with_cuda"] else []),
        extra_ldflags=extra_ldflags, with_cuda=args["with_cuda"],
        build_directory=build_dir, verbose=verbose)
