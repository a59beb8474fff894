"""A repository for the local CUDA toolkit that degrades to an empty stub.

Machines without /usr/local/cuda (a CI runner, say) still load every BUILD file:
`@cuda//:available` then reports False and the CUDA targets are incompatible.
"""

def _local_cuda_impl(ctx):
    root = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    if ctx.path(root + "/include/cuda_runtime.h").exists:
        ctx.symlink(root + "/include", "include")
        ctx.symlink(root + "/lib64", "lib64")
        ctx.symlink(ctx.attr.build_file, "BUILD")
        ctx.file("defs.bzl", "CUDA_AVAILABLE = True\n")
    else:
        ctx.file("BUILD", 'package(default_visibility = ["//visibility:public"])\n' +
                          'cc_library(name = "cudart")\n' +
                          'cc_library(name = "cublas")\n')
        ctx.file("defs.bzl", "CUDA_AVAILABLE = False\n")

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    attrs = {"build_file": attr.label()},
    environ = ["CUDA_PATH"],
    local = True,
)
