"""Builds actoffload with its compiled module, actoffload._C.

    pip install --no-build-isolation ./python      (from the repository root)

The C++ sources are outside this folder (../engine, ../backends, and
actoffload/csrc); actoffload/sources.txt lists them. They are found relative
to this file, so the build must run in the checkout: pip >= 21.3 builds a
local folder in place (older pips copied it to a temporary folder first; this
script then stops and says so). torch.utils.cpp_extension compiles them with
the flags of the development build (actoffload/_build.py, loaded here by its
path): a CUDA build (CUDAExtension, the CUDA backend, -DACTOFFLOAD_WITH_CUDA,
cudart) when torch has CUDA and a toolkit is found (CUDA_HOME) unless
ACTOFFLOAD_NO_CUDA=1, else a CPU build (CppExtension, the simulated GPU
only). MAX_JOBS sets the number of parallel compiles.
"""

import importlib.util
import os
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
os.chdir(HERE)  # pip runs here already; `python3 python/setup.py` may not


def load_build_module():
    path = os.path.join(HERE, "actoffload", "_build.py")
    spec = importlib.util.spec_from_file_location("_actoffload_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def extension():
    try:
        from torch.utils import cpp_extension
    except ImportError as error:
        sys.exit(f"actoffload: setup.py needs PyTorch in the Python that runs "
                 f"it ({sys.executable}: {error}); install with "
                 "`pip install --no-build-isolation ./python` so that the "
                 "build uses the installed torch")
    build = load_build_module()
    if not os.path.isfile(os.path.join(REPO_ROOT, "engine", "offload.h")):
        sys.exit(f"actoffload: the engine's sources are not at "
                 f"{REPO_ROOT}/engine. setup.py must run inside the "
                 "repository checkout (python/ next to engine/ and "
                 "backends/); pip older than 21.3 copies the folder elsewhere "
                 "first: upgrade pip, or add --use-feature=in-tree-build "
                 "(pip 21.1-21.2)")
    try:
        args = build.extension_args(REPO_ROOT)
    except ImportError as error:
        sys.exit(str(error))
    with_cuda = args["with_cuda"]
    print(f"actoffload: building actoffload._C ({len(args['sources'])} "
          f"sources, {'CUDA' if with_cuda else 'CPU only'}, "
          f"MAX_JOBS={os.environ.get('MAX_JOBS', 'all cores')})",
          file=sys.stderr)
    kind = cpp_extension.CUDAExtension if with_cuda else cpp_extension.CppExtension
    options = {}
    if with_cuda:
        # What _build.py passes for CUDA (CUDAExtension adds the toolkit's
        # include folder and cudart as well; the repeat is harmless).
        options["library_dirs"] = [
            os.path.join(cpp_extension.CUDA_HOME, "lib64")]
        options["libraries"] = ["cudart"]
    return [kind(
        name="actoffload._C",
        # Relative to this folder (the current one): setuptools refuses
        # absolute paths here. Objects go to build/ (under build/engine/...
        # for ../engine/...).
        sources=[os.path.relpath(path, HERE) for path in args["sources"]],
        include_dirs=args["extra_include_paths"],
        # -g0: Python's own CFLAGS (Debian's carry -g) would add debug info
        # that the development build has not (13 MB, +30 s on 2 cores).
        extra_compile_args={"cxx": args["extra_cflags"] + ["-g0"]},
        **options)], cpp_extension.BuildExtension


ext_modules, build_ext = extension()

setup(
    packages=["actoffload"],
    include_package_data=False,  # not the binding's .cc files
    ext_modules=ext_modules,
    cmdclass={"build_ext": build_ext},
    zip_safe=False,
)
