"""Megatron-LM's fine-grained activation offloading for one pipeline rank
(SPEC §5, engine/pipeline_offload.h):

    fg = FineGrainedOffloader(offload_modules=["core_attn", "mlp"])
    with fg.chunk(stage=0, microbatch=0):
        h = fg.group_start(h, "core_attn")
        h = attention(h)
        h = fg.group_commit(h, "core_attn")
        ...
    loss.backward()
    fg.finish_iteration()      # after every chunk's backward
    print(fg.summary_table())  # after the first (warm-up) iteration

An exception that leaves a chunk's forward abandons the iteration (SPEC
§7.2: its memory is released, a warning says so, the exception goes on) and
the next chunk() begins a new one; after an exception elsewhere in a step
(a backward, a schedule between chunks), call fg.abandon_iteration() before
trying again.

group_start / group_commit are identities on the tensor that flows through
the submodule. Forward: GroupStart / GroupCommit (the group's offload starts
at its commit). Backward, in reverse: the gradient reaching the committed
output begins the group's backward (GroupBackwardStart, after
StartChunkBackward for the chunk's first group), and the gradient reaching
the group's input ends it (GroupBackwardEnd, which reloads the next
offloaded group). The tensor given to group_start must require grad, as
Megatron's hidden states do.
"""

import contextlib
import warnings

import torch

from . import _common


class _GroupStart(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, owner, name):
        owner.core.group_start(name)
        ctx.owner = owner
        ctx.name = name
        return tensor

    @staticmethod
    def backward(ctx, grad):
        ctx.owner.core.group_backward_end(ctx.name)
        return grad, None, None


class _GroupCommit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, owner, name, release, chunk):
        owner.core.group_commit(name, release)
        ctx.owner = owner
        ctx.name = name
        ctx.chunk = chunk
        return tensor

    @staticmethod
    def backward(ctx, grad):
        ctx.owner._begin_group_backward(ctx.chunk, ctx.name)
        return grad, None, None, None, None


class FineGrainedOffloader:
    """One rank's fine-grained offloader.

    offload_modules: the group names offloaded (Megatron's --offload-modules).
    min_offload_size: elements (default 1 Mi, Megatron's).
    fraction, delta_offload_bytes, pipeline_rank, virtual_stages,
    max_inflight ({name: n}), pinned_pool: SPEC §5.4-§5.6.
    backend / session: as for get_cpu_offload_context.
    """

    def __init__(self, offload_modules, *, min_offload_size=1024 * 1024,
                 fraction=1.0, delta_offload_bytes=0, pipeline_rank=0,
                 virtual_stages=1, max_inflight=None, pinned_pool=True,
                 backend=None, session=None):
        self.session = session if session is not None else _common.new_session(backend)
        self.core = _common.ext().FineGrainedOffloader(
            self.session, offload_modules=list(offload_modules),
            min_offload_elements=min_offload_size, fraction=fraction,
            delta_offload_bytes=delta_offload_bytes, pipeline_rank=pipeline_rank,
            virtual_stages=virtual_stages, max_inflight=dict(max_inflight or {}),
            pinned_pool=pinned_pool)
        self._filter = _common.SavedTensorFilter(self.session, self.core,
                                                 min_offload_size)
        self._chunk = None           # forward chunk running
        self._backward_chunk = None  # backward chunk running
        self._forwards = {}          # stage -> chunks started this iteration

    @contextlib.contextmanager
    def chunk(self, stage=0, microbatch=0):
        """The forward of one chunk (a model chunk for one microbatch).
        microbatch=None: the stage's next microbatch in this iteration
        (0, 1, ...), for a schedule that runs a stage's microbatches in
        order without naming them (torch.distributed.pipelining)."""
        _common.check_stream(self.session)
        if microbatch is None:
            microbatch = self._forwards.get(stage, 0)
        self.core.start_chunk(stage, microbatch)
        self._forwards[stage] = max(self._forwards.get(stage, 0), microbatch + 1)
        self._chunk = (stage, microbatch)
        try:
            with self._filter.hooks():
                yield self
        except BaseException:
            self._chunk = None
            try:
                self.abandon_iteration()
            except Exception as refused:  # the caller's exception goes on, not this one
                warnings.warn(f"actoffload: the interrupted iteration was not dropped: "
                              f"{refused}", stacklevel=3)
            raise
        finally:
            self._chunk = None

    @property
    def in_chunk(self):
        """Whether a chunk's forward is running (inside chunk())."""
        return self._chunk is not None

    def group_start(self, tensor, name):
        return _GroupStart.apply(tensor, self, name)

    def group_commit(self, tensor, name, release_tensors=()):
        """Commits group `name`; release_tensors are freed once copied even
        though the caller holds them (Megatron's forced release), when no
        other live handle needs them."""
        return _GroupCommit.apply(tensor, self, name, list(release_tensors),
                                  self._chunk)

    def _begin_group_backward(self, chunk, name):
        if chunk != self._backward_chunk:
            self.core.start_chunk_backward(*chunk)
            self._backward_chunk = chunk
        self.core.group_backward_start(name)

    def finish_iteration(self):
        """After every chunk's backward: ends the iteration (the first one
        freezes the plan and the summary)."""
        self.core.finish_iteration()
        self._backward_chunk = None
        self._forwards = {}

    def abandon_iteration(self):
        """Drops the iteration wherever it is (SPEC §7.2): every group's
        memory is released (warned), the microbatch count starts again, and
        the next chunk() begins a new iteration; during the warm-up
        iteration, the next one warms up again. Handles of the dropped
        iteration are refused if its graph is ever run backward. A no-op
        between iterations."""
        before = len(self.core.warnings())
        try:
            self.core.abandon_iteration()
        finally:
            self._backward_chunk = None
            self._forwards = {}
            for message in self.core.warnings()[before:]:
                warnings.warn("actoffload: " + message, stacklevel=3)

    def summary_table(self):
        return self.core.summary_table()

    @property
    def warmed_up(self):
        return self.core.warmed_up()
