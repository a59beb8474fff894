"""The rank logic of pipeline-parallel fine-grained offloading (SPEC §5), on
CPU torch with two gloo processes and the simulated GPU.

Each test spawns two ranks (world size 2, a FileStore in tmp_path) that run
a small decoder-like stack per pipeline stage, driven by a hand-written
schedule (no torch.distributed.pipelining: torch 1.13 has none) whose
activations and gradients travel between the ranks with isend/recv:

  - plain 1F1B, pp=2, 4 microbatches: rank 0 F0 F1 B0 F2 B1 F3 B2 B3,
    rank 1 F0 B0 F1 B1 F2 B2 F3 B3;
  - interleaved 1F1B, pp=2, vpp=2 (rank r holds global stages r and r+2),
    4 microbatches, in Megatron's order (per rank: forward s0m0 s0m1 s1m0
    s1m1 s0m2 s0m3 s1m2 s1m3, backward s1m0 s1m1 s0m0 s0m1 s1m2 s1m3 s0m2
    s0m3, SPEC §5.2).

What they prove: every iteration's losses and every parameter gradient on
both ranks are bit-identical to the same schedule without an offloader,
with bytes actually offloaded and no hazard on the simulated GPU; the
pipeline-rank delta (§5.4b) keeps rank x delta bytes on device; misuse
after the freeze is the engine's error on each rank, not a hang.

A child's exception comes back with its traceback and fails the test; a
child that does not finish within the deadline is killed and fails it. The
model, the schedule driver, the scenarios and the two-process launcher are
pipeline_cpu_testing.py's.
"""

import torch

from pipeline_cpu_testing import (
    INTERLEAVED, ITERATIONS, MICROBATCHES, ONE_F_ONE_B, PP, check_delta,
    check_summary_table, deadlock_free, run_two_ranks)

SPEC_FORWARD = [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)]
SPEC_BACKWARD = [(1, 0), (1, 1), (0, 0), (0, 1), (1, 2), (1, 3), (0, 2), (0, 3)]


# --------------------------------------------------------------------------
# The tests.

def assert_bit_identical(results):
    for rank, r in enumerate(results):
        assert len(r["got"]) == len(r["reference"]) == ITERATIONS
        for i, ((losses, grads), (ref_losses, ref_grads)) in enumerate(
                zip(r["got"], r["reference"])):
            assert losses.keys() == ref_losses.keys()
            for mb in ref_losses:
                assert torch.equal(losses[mb], ref_losses[mb]), (rank, i, mb)
            assert len(grads) == len(ref_grads) > 0
            for j, (a, b) in enumerate(zip(grads, ref_grads)):
                assert torch.equal(a, b), (
                    f"rank {rank}, iteration {i}: gradient {j} differs by "
                    f"{(a - b).abs().max().item()}")
    # The loss is on rank 1 (the last stage: global stage 1, or 3 of 4).
    assert sorted(results[1]["got"][0][0]) == list(range(MICROBATCHES))
    assert results[0]["got"][0][0] == {}


def assert_offloaded_without_hazards(results):
    for rank, r in enumerate(results):
        assert r["warmed_up"], rank
        assert r["stats"]["bytes_offloaded"] > 0, (rank, r["stats"])
        assert r["stats"]["bytes_reloaded"] > 0, (rank, r["stats"])
        # Offloading goes on after the freeze, not only in the warm-up.
        assert all(b > 0 for b in r["iteration_bytes"]), (rank, r["iteration_bytes"])
        assert r["hazards"] == [], (rank, r["hazards"])
        check_summary_table(r["summary"], rank)


def test_schedules_are_deadlock_free_and_in_the_engines_order():
    assert deadlock_free(ONE_F_ONE_B) and deadlock_free(INTERLEAVED)
    # A swapped backward is caught by the checker (so it checks something).
    bad = {0: list(ONE_F_ONE_B[0]), 1: list(ONE_F_ONE_B[1])}
    bad[1][0], bad[1][1] = bad[1][1], bad[1][0]
    assert not deadlock_free(bad)
    for rank in range(PP):
        # 1F1B: warm-up of pp - rank - 1 forwards, then one forward, one
        # backward; backward order = forward order.
        order = ONE_F_ONE_B[rank]
        assert [k for k, _, _ in order[:PP - rank + 1]] == ["F"] * (PP - rank) + ["B"]
        forward = [(v, m) for k, v, m in order if k == "F"]
        assert forward == [(v, m) for k, v, m in order if k == "B"]
        order = INTERLEAVED[rank]
        assert [(v, m) for k, v, m in order if k == "F"] == SPEC_FORWARD
        assert [(v, m) for k, v, m in order if k == "B"] == SPEC_BACKWARD


def test_one_f_one_b_is_bit_identical_on_both_ranks(tmp_path):
    results = run_two_ranks("one_f_one_b", tmp_path)
    assert_bit_identical(results)
    assert_offloaded_without_hazards(results)


def test_interleaved_one_f_one_b_is_bit_identical_on_both_ranks(tmp_path):
    results = run_two_ranks("interleaved", tmp_path)
    assert_bit_identical(results)
    assert_offloaded_without_hazards(results)


def test_pipeline_rank_delta_keeps_rank_times_delta_on_device(tmp_path):
    # The checks run on rank 0 over both ranks' gathered stats; here again
    # on what rank 0 gathered, to see that it gathered both.
    gathered = run_two_ranks("delta", tmp_path)[0]
    assert len(gathered) == PP
    check_delta(gathered)


def test_misuse_after_the_freeze_is_the_engines_error_on_each_rank(tmp_path):
    results = run_two_ranks("misuse", tmp_path)
    for rank in range(PP):
        assert "error" in results[rank], f"rank {rank}'s misuse raised nothing"
    name, is_offload_error, message = results[1]["error"]
    assert is_offload_error, (name, message)
    assert "FAILED_PRECONDITION" in message and "workload changed" in message, message
    assert "3 chunks ran, warm-up ran 4" in message, message
    name, is_offload_error, message = results[0]["error"]
    assert is_offload_error, (name, message)
    assert "FAILED_PRECONDITION" in message and "workload changed" in message, message
    assert "microbatch 1" in message, message
