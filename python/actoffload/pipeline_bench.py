"""NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
    torchrun --nproc_per_node 2 -m actoffload.pipeline_bench [--vpp 1|2]

A Hugging Face Llama from a config (bf16, eager attention, deterministic
algorithms) split into pipeline stages over the GPUs of one host, one
process per GPU, run by torch.distributed.pipelining: Schedule1F1B (--vpp 1,
a stage per rank) or ScheduleInterleaved1F1B (--vpp 2: rank r holds stages
r and r + pp). Each rank has a FineGrainedOffloader (SPEC §5) with
Megatron's groups on each of its decoder layers (megatron_groups.py); each
stage's forward is one chunk, numbered in the schedule's own order. Trained
for a few steps without offloading and then with it, in the same process:
per rank the step (the slowest rank's, median) and peak
(max_memory_allocated above the allocation before the step) as ratios to no
offloading, whether the loss and every gradient are bit-identical to it, and
each rank's summary table (offloaded MB per group, after the warm-up).
"""

import argparse
import contextlib

import torch
import torch.nn.functional as F

import actoffload
from . import demo, dist_bench, megatron_groups


class Stage(torch.nn.Module):
    """A contiguous slice of the model's decoder layers; the first stage
    embeds the tokens, the last applies the final norm and the head. Its
    forward is one chunk of the rank's offloader, when it has one."""

    def __init__(self, model, layer_ids, first, last, local_stage):
        super().__init__()
        inner = model.model
        self.embed = inner.embed_tokens if first else None
        self.layers = torch.nn.ModuleList(inner.layers[i] for i in layer_ids)
        self.rotary = inner.rotary_emb
        self.norm = inner.norm if last else None
        self.head = model.lm_head if last else None
        self.local_stage = local_stage
        self.offloader = None

    def forward(self, x):
        chunk = contextlib.nullcontext()
        if self.offloader is not None and torch.is_grad_enabled() and x.device.type == "cuda":
            chunk = self.offloader.chunk(self.local_stage, None)
        with chunk:
            if self.embed is not None:
                x = self.embed(x)
            s = x.shape[1]
            positions = torch.arange(s, device=x.device)[None]
            rotary = self.rotary(x, positions)
            mask = torch.full((s, s), torch.finfo(x.dtype).min, dtype=x.dtype,
                              device=x.device).triu(1)[None, None]
            for layer in self.layers:
                x = layer(x, attention_mask=mask, position_ids=positions,
                          position_embeddings=rotary)
                x = x[0] if isinstance(x, tuple) else x
            if self.head is not None:
                x = self.head(self.norm(x))
            return x


def loss_fn(logits, target):
    return F.cross_entropy(logits.float().flatten(0, 1), target.flatten())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--vpp", type=int, choices=(1, 2), default=1)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--model", choices=("llama", "moe"), default="llama",
                        help="Llama, or Qwen2-MoE (its expert bank a group of its own)")
    parser.add_argument("--groups", default=None,
                        help="the group names offloaded, comma-separated; several sets "
                             "separated by ';' give a row each (default: every group; "
                             "every group but core_attn)")
    parser.add_argument("--delta", type=int, default=0,
                        help="delta_offload_bytes: rank r keeps r x delta on device")
    parser.add_argument("--steps", type=int, default=9,
                        help="rounds: each system's steps, timed interleaved")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B,
                                              ScheduleInterleaved1F1B)
    rank, pp, device = dist_bench.init(deterministic=args.model == "llama")
    model = demo.build_model(args.model, args.hidden, args.layers, "eager", args.seed)
    every = megatron_groups.MOE_GROUPS if args.model == "moe" else megatron_groups.GROUPS
    if args.groups is None:
        args.groups = ",".join(every) + ";" + ",".join(g for g in every if g != "core_attn")
    n_stages = pp * args.vpp
    per_stage = args.layers // n_stages
    if per_stage * n_stages != args.layers:
        raise SystemExit(f"--layers {args.layers} is not a multiple of {n_stages} stages")
    stages, modules = [], []
    for local in range(args.vpp):
        index = rank + local * pp
        module = Stage(model, range(index * per_stage, (index + 1) * per_stage),
                       index == 0, index == n_stages - 1, local)
        modules.append(module)
        stages.append(PipelineStage(module, index, n_stages, device))
    if args.vpp == 1:
        schedule = Schedule1F1B(stages[0], args.microbatches, loss_fn=loss_fn)
    else:
        schedule = ScheduleInterleaved1F1B(stages, args.microbatches, loss_fn=loss_fn)
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, model.config.vocab_size, (args.microbatches, args.seq),
                        generator=gen).to(device)
    params = [p for m in modules for p in m.parameters()]
    last = any(m.head is not None for m in modules)

    def step(fg=None):
        for p in params:
            p.grad = None
        losses = []
        kwargs = {"target": ids, "losses": losses} if last else {}
        if rank == 0:
            schedule.step(ids, **kwargs)
        else:
            schedule.step(**kwargs)
        if fg is not None:
            fg.finish_iteration()
        return torch.stack(losses).sum() if losses else None

    def grads():
        return [None if p.grad is None else p.grad.detach().clone() for p in params]

    def offloaded_step(fg):
        """One step with fg's groups on the rank's layers (attached for the
        step, so that the systems can take turns)."""
        handles = []
        for module in modules:
            handles += megatron_groups.attach_groups(fg, module.layers)
            module.offloader = fg
        try:
            return step(fg)
        finally:
            for h in handles:
                h.remove()
            for module in modules:
                module.offloader = None

    systems, offloaders = {"no offload": step}, {}
    for names in args.groups.split(";"):
        groups = [g for g in names.split(",") if g]
        fg = actoffload.FineGrainedOffloader(groups, virtual_stages=args.vpp,
                                             pipeline_rank=rank, delta_offload_bytes=args.delta)
        label = "fine-grained: " + ", ".join(groups)
        systems[label] = lambda fg=fg: offloaded_step(fg)
        offloaders[label] = fg
    systems[dist_bench.AGAIN] = step
    results = dist_bench.interleaved(systems, grads, args.steps)
    rows, tables = [], {}
    for label, result in results.items():
        extra = {}
        if label in offloaders:
            fg = offloaders[label]
            before = fg.core.stats()["bytes_offloaded"]
            systems[label]()  # one more, for the bytes one step offloads
            extra["offloaded MiB/step"] = f"{(fg.core.stats()['bytes_offloaded'] - before) / 2**20:.1f}"
            everyone = [None] * pp
            torch.distributed.all_gather_object(everyone, fg.summary_table())
            tables[label] = everyone
        rows.append(dist_bench.row(label, results["no offload"], result, **extra))
    schedule_name = "Schedule1F1B" if args.vpp == 1 else "ScheduleInterleaved1F1B"
    model_name = "Qwen2-MoE" if args.model == "moe" else "Llama"
    title = (f"{schedule_name}, pp {pp}, vpp {args.vpp}, {args.microbatches} microbatches of "
             f"1x{args.seq} tokens, {model_name} hidden {args.hidden}, {args.layers} layers, bf16, eager "
             f"attention ({torch.cuda.get_device_name()}, torch {torch.__version__}); "
             f"delta {args.delta}")
    gathered = dist_bench.print_table(title, rows, ["offloaded MiB/step"])
    if rank == 0:
        for label, everyone in tables.items():
            for r, table in enumerate(everyone):
                print(f"\n### {label}: rank {r}, summary after warm-up\n\n```\n{table}\n```")
    torch.distributed.destroy_process_group()
    dist_bench.exit_unless_identical(gathered)


if __name__ == "__main__":
    main()
