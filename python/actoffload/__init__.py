"""actoffload: activation offloading for PyTorch, done by a C++ engine.

Three front doors over one engine (the repository's engine/):
  - get_cpu_offload_context, mark_not_offload, start_offload: Transformer
    Engine's layer API, drop-in (te.py);
  - OffloadActivations: a context around a whole forward (torchtune's
    usage), with a byte budget (whole_model.py);
  - FineGrainedOffloader: Megatron-LM's fine-grained, named-group calls for
    one pipeline rank (fine_grained.py).
Errors raise actoffload.OffloadError (a RuntimeError) with the engine's
message; where the device's memory ran out, actoffload.OffloadOutOfMemoryError,
which is also a torch.cuda.OutOfMemoryError. The engine is compiled at first use (see _build.py) unless
installed with `pip install --no-build-isolation ./python`.
"""

from .fine_grained import FineGrainedOffloader
from .te import get_cpu_offload_context, mark_not_offload, start_offload
from .torchtune_compat import NoOpManager, get_act_offloading_ctx_manager
from .whole_model import OffloadActivations, find_layers
from ._common import new_session


def __getattr__(name):
    # The exception classes live in the compiled module; built on first use.
    if name in ("OffloadError", "OffloadOutOfMemoryError"):
        from ._common import ext
        return getattr(ext(), name)
    raise AttributeError(name)


__all__ = ["get_cpu_offload_context", "mark_not_offload", "start_offload",
           "OffloadActivations", "NoOpManager", "get_act_offloading_ctx_manager",
           "FineGrainedOffloader", "find_layers",
           "new_session", "OffloadError", "OffloadOutOfMemoryError"]
