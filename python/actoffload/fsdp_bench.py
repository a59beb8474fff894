"""NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
    torchrun --nproc_per_node 2 -m actoffload.fsdp_bench [--parallel fsdp|tp]

A Hugging Face Llama from a config (bf16, eager attention, deterministic
algorithms) over the GPUs of one host, one process per GPU, trained for a
few steps without offloading and under each front door in the same process:
TE's context on each decoder layer (k of n) and OffloadActivations (k of n).

--parallel fsdp: FSDP2's fully_shard on each decoder layer and on the root;
each rank its own batch. Sharded parameters and their all-gathered views are
never offloaded (SPEC §7.5): each rank's offloaded bytes per step must equal
those of the same door on an unsharded copy of the model with that rank's
batch, which the table shows beside them.
--parallel tp: tensor parallelism over a 1-D mesh of every GPU
(ColwiseParallel on q/k/v/gate/up, RowwiseParallel on o/down), the same batch
on every rank. The activations the parallel linears save are DTensors: each
is offloaded as its local shard (the table's "DTensor shards"), never
gathered whole, and rebuilt with the same placements.

Per rank: the step (the slowest rank's, median), the peak
(max_memory_allocated above the allocation before the step), both as ratios
to no offloading, and whether the loss and every local gradient shard are
bit-identical to no offloading.
"""

import argparse
import contextlib

import torch

import actoffload
from . import demo, dist_bench


def parallelize(model, kind, world):
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cuda", (world,))
    layers = demo.decoder_layers(model)
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for layer in layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    plan = {f"self_attn.{p}": ColwiseParallel() for p in ("q_proj", "k_proj", "v_proj")}
    plan.update({"self_attn.o_proj": RowwiseParallel(), "mlp.gate_proj": ColwiseParallel(),
                 "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()})
    for layer in layers:
        parallelize_module(layer, mesh, plan)


def doors(model, n, k):
    """label -> (a fresh wrap per step, the engine's loop)."""
    ctx, sync = actoffload.get_cpu_offload_context(True, num_layers=k, model_layers=n)
    whole = actoffload.OffloadActivations(layers=demo.decoder_layers(model), num_layers=k,
                                          model=model)
    return {f"TE context k={k}/{n}": (lambda: demo.te_hooks(model, ctx, sync), ctx.offloader),
            f"OffloadActivations k={k}/{n}": (lambda: whole, whole.offloader)}


def step_of(model, ids, wrap):
    def step():
        for p in model.parameters():
            p.grad = None
        with wrap():
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.loss
    return step


def offloaded_per_step(model, ids, wrap, loop, steps=2):
    """Bytes the door offloads per step, and of them the DTensor shards'
    (after one warm-up step)."""
    step = step_of(model, ids, wrap)
    step()
    before = loop.stats()["bytes_offloaded"], loop.dtensor_shard_bytes
    for _ in range(steps):
        step()
    return ((loop.stats()["bytes_offloaded"] - before[0]) // steps,
            (loop.dtensor_shard_bytes - before[1]) // steps)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--parallel", choices=("fsdp", "tp"), default="fsdp")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--ks", default=None,
                        help="layers offloaded of n, comma-separated (default n/4, n/2)")
    parser.add_argument("--steps", type=int, default=9,
                        help="rounds: each system's steps, timed interleaved")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rank, world, device = dist_bench.init()
    per_rank = args.parallel == "fsdp"  # data parallel: a batch of its own
    gen = torch.Generator().manual_seed(args.seed + (rank if per_rank else 0))
    model = demo.build_model("llama", args.hidden, args.layers, "eager", args.seed)
    n = len(demo.decoder_layers(model))
    ks = ([int(k) for k in args.ks.split(",")] if args.ks else
          sorted({max(1, n // 4), max(1, n // 2)}))
    if not all(0 < k < n for k in ks):
        raise SystemExit(f"--ks {ks}: offload 1 to {n - 1} of the {n} layers")
    ids = torch.randint(0, model.config.vocab_size, (1, args.seq), generator=gen).to(device)

    unsharded = {}
    if args.parallel == "fsdp":  # each door's bytes on the unsharded model
        for k in ks:
            for label, (wrap, loop) in doors(model, n, k).items():
                unsharded[label] = offloaded_per_step(model, ids, wrap, loop)[0]
        for p in model.parameters():
            p.grad = None
    parallelize(model, args.parallel, world)

    systems = {"no offload": step_of(model, ids, contextlib.nullcontext)}
    doors_of = {}
    for k in ks:
        for label, (wrap, loop) in doors(model, n, k).items():
            systems[label] = step_of(model, ids, wrap)
            doors_of[label] = (wrap, loop)
    systems[dist_bench.AGAIN] = systems["no offload"]
    results = dist_bench.interleaved(systems, lambda: dist_bench.local_grads(model), args.steps)
    rows = []
    for label, result in results.items():
        extra = {}
        if label in doors_of:
            offloaded, shards = offloaded_per_step(model, ids, *doors_of[label])
            extra = {"offloaded MiB/step": f"{offloaded / 2**20:.1f}",
                     "of it DTensor shards": f"{shards / 2**20:.1f}"}
            if label in unsharded:
                extra["unsharded run MiB/step"] = f"{unsharded[label] / 2**20:.1f}"
        rows.append(dist_bench.row(label, results["no offload"], result, **extra))
    columns = ["offloaded MiB/step", "of it DTensor shards"]
    if unsharded:
        columns.append("unsharded run MiB/step")
    title = (f"{args.parallel.upper()} over {world} GPUs ({torch.cuda.get_device_name()}): "
             f"Llama hidden {args.hidden}, {n} layers, 1x{args.seq} tokens per rank, bf16, "
             f"eager attention, torch {torch.__version__}")
    gathered = dist_bench.print_table(title, rows, columns)
    torch.distributed.destroy_process_group()
    dist_bench.exit_unless_identical(gathered)


if __name__ == "__main__":
    main()
