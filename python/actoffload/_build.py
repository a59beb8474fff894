"""Builds the C++ engine into actoffload's extension module.

The extension is the engine (engine/), the simulated GPU (backends/sim/),
the CUDA backend (backends/cuda/, only when CUDA is there) and the binding
(actoffload/csrc/), compiled from this checkout: nothing is downloaded. The
files are listed once, in sources.txt beside this file (Bazel's filegroups
are kept equal to it by //python:sources_list_test).

Two ways to get the module:
  - `pip install --no-build-isolation ./python` compiles it once, with
    python/setup.py, into the installed package as actoffload._C;
    load_extension() imports that (load_installed()) and compiles nothing.
  - In a checkout without an installed module, the first import compiles it
    with cpp_extension.load into a cache folder (ACTOFFLOAD_BUILD_DIR,
    default ~/.cache/actoffload) and later imports load it from there,
    rebuilding only what changed.

python/setup.py loads this file by its path (no package import, no torch
needed to read it): keep its module-level imports to the standard library.
"""

import importlib
import importlib.util
import os
import sys
import time

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# python/actoffload -> the repository root (engine/, backends/ live there).
REPO_ROOT = os.path.dirname(os.path.dirname(PACKAGE_DIR))
SOURCES_FILE = os.path.join(PACKAGE_DIR, "sources.txt")
# The module pip install builds into the package (setup.py uses this name).
INSTALLED_MODULE = "actoffload._C"


def read_sources(with_cuda, root=REPO_ROOT, sources_file=SOURCES_FILE):
    """The paths in sources.txt under root; "cuda:" lines only with_cuda.
    Raises ImportError naming the first listed file that is not there."""
    sources = []
    with open(sources_file, encoding="utf-8") as listing:
        for line in listing:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            cuda_only = line.startswith("cuda:")
            if cuda_only:
                line = line[len("cuda:"):].strip()
            if cuda_only and not with_cuda:
                continue
            path = os.path.join(root, line)
            if not os.path.isfile(path):
                raise ImportError(
                    f"actoffload: {line}, listed in {sources_file}, is not "
                    f"at {path}")
            sources.append(path)
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
            f"actoffload: no compiled module ({INSTALLED_MODULE}) is installed "
            f"and the engine's sources are not at {root}/engine to build one; "
            "from a checkout of the repository, install it with "
            "`pip install --no-build-isolation ./python`")
    flags = ["-std=c++20", os.environ.get("ACTOFFLOAD_OPT", "-O2"), "-DNDEBUG"]
    if with_cuda:
        flags.append("-DACTOFFLOAD_WITH_CUDA")
    return {
        "name": "actoffload_C_cuda" if with_cuda else "actoffload_C_cpu",
        "sources": read_sources(with_cuda, root),
        "extra_cflags": flags,
        "extra_include_paths": [root],
        "with_cuda": with_cuda,
    }


def load_installed():
    """The module that pip install compiled into the package (actoffload._C),
    or None when there is none (a checkout). One that is there but fails to
    load (say, built against another torch) raises ImportError."""
    if importlib.util.find_spec(INSTALLED_MODULE) is None:
        return None
    try:
        return importlib.import_module(INSTALLED_MODULE)
    except ImportError as error:
        raise ImportError(
            f"actoffload: the installed {INSTALLED_MODULE} does not load "
            f"({error}); was it built against another torch? Reinstall with "
            "`pip install --no-build-isolation ./python`") from error


def _build_is_stale(library, sources):
    """Whether cpp_extension.load will compile: no library yet, or a source
    or a header beside one newer than it (a guess for the message only; ninja
    decides)."""
    if not os.path.exists(library):
        return True
    built = os.path.getmtime(library)
    folders = {os.path.dirname(path) for path in sources}
    headers = [os.path.join(folder, name) for folder in folders
               for name in os.listdir(folder) if name.endswith(".h")]
    return any(os.path.getmtime(path) > built for path in sources + headers)


def load_jit(verbose=False):
    """Compiles (if needed) into the cache folder and imports the module, from
    this checkout's sources (the development build)."""
    from torch.utils import cpp_extension
    args = extension_args()
    build_dir = os.environ.get("ACTOFFLOAD_BUILD_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "actoffload", args["name"])
    os.makedirs(build_dir, exist_ok=True)
    os.environ.setdefault("MAX_JOBS", str(max(1, os.cpu_count() or 1)))
    extra_ldflags = []
    if args["with_cuda"]:
        extra_ldflags = ["-L" + os.path.join(cpp_extension.CUDA_HOME, "lib64"),
                         "-lcudart"]
    library = os.path.join(build_dir, args["name"] + ".so")
    first = not os.path.exists(library)
    if _build_is_stale(library, args["sources"]):
        print(f"actoffload: compiling the C++ engine ({len(args['sources'])} "
              f"sources{', CUDA' if args['with_cuda'] else ''}) into "
              f"{build_dir} with MAX_JOBS={os.environ['MAX_JOBS']}; "
              + ("the first build takes about 1.5 min on 2 cores, 40 s on "
                 "16; later imports reuse it"
                 if first else "only what changed is recompiled")
              + " (`pip install --no-build-isolation ./python` builds it "
              "once instead)", file=sys.stderr, flush=True)
    start = time.monotonic()
    module = cpp_extension.load(
        name=args["name"], sources=args["sources"],
        extra_cflags=args["extra_cflags"],
        extra_include_paths=args["extra_include_paths"]
        + ([os.path.join(cpp_extension.CUDA_HOME, "include")]
           if args["with_cuda"] else []),
        extra_ldflags=extra_ldflags, with_cuda=args["with_cuda"],
        build_directory=build_dir, verbose=verbose)
    elapsed = time.monotonic() - start
    if elapsed > 2:
        print(f"actoffload: built in {elapsed:.0f} s ({library})",
              file=sys.stderr, flush=True)
    return module


def load_extension(verbose=False):
    """The extension module: the installed actoffload._C if there is one,
    else the development build from this checkout (load_jit)."""
    try:
        import torch  # noqa: F401
    except ImportError as error:
        raise ImportError(
            "actoffload needs PyTorch (import torch failed: %s)" % error) from error
    module = load_installed()
    if module is not None:
        return module
    prebuilt = os.environ.get("ACTOFFLOAD_PREBUILT")
    if prebuilt:
        return load_prebuilt(prebuilt)
    return load_jit(verbose)


def load_prebuilt(path):
    """The module load_jit built elsewhere, from its library (Bazel's
    //python:extension for the tests: ACTOFFLOAD_PREBUILT names it). Raises
    ImportError when it is not there or does not load."""
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or not os.path.isfile(path):
        raise ImportError(f"actoffload: ACTOFFLOAD_PREBUILT={path} is not a "
                          "built extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_to(library):
    """Builds the development module (load_jit, CPU only) in a folder beside
    `library` and copies its library there: Bazel's //python:extension."""
    import shutil
    os.environ["ACTOFFLOAD_NO_CUDA"] = "1"
    folder = os.path.join(os.path.dirname(os.path.abspath(library)), "extension_build")
    os.environ["ACTOFFLOAD_BUILD_DIR"] = folder
    module = load_jit()
    shutil.copyfile(module.__file__, library)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--build-to":
    build_to(sys.argv[2])
