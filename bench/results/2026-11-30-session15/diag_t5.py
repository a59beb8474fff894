"""T5 with SDPA (models_sweep.py's T5): how far each gradient moves between
repeats of the same step without the package, and with Hugging Face's own
gradient checkpointing (every block re-run), against the budget's differences
of run 90 (gradient 79: 6.1e-05).

    PYTHONPATH=python python bench/results/2026-11-30-session15/diag_t5.py --sdpa
"""
import sys

import torch

sys.argv = [sys.argv[0], "--sdpa"]
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import models_sweep as ms  # noqa: E402

torch.use_deterministic_algorithms(True, warn_only=True)
model = ms.build(*[arch for arch in ms.ARCHS if arch[0] == "T5Config"][0])
ids = torch.randint(0, ms.VOCAB, (1, ms.SEQ), generator=torch.Generator().manual_seed(0)).cuda()
import contextlib  # noqa: E402
plain = contextlib.nullcontext
ref = ms.step(model, ids, plain)
names = [n for n, _ in model.named_parameters()]


def spread(runs):
    out = []
    for i in range(len(ref[1])):
        d = max((r[1][i].float() - ref[1][i].float()).abs().max().item() for r in runs)
        out.append(d)
    return out


repeats = [ms.step(model, ids, plain) for _ in range(5)]
rep = spread(repeats)
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
ckpt = [ms.step(model, ids, plain) for _ in range(3)]
ck = spread(ckpt)
print("losses equal: repeats", all(torch.equal(r[0], ref[0]) for r in repeats),
      "checkpointed", all(torch.equal(r[0], ref[0]) for r in ckpt))
print("gradient 79:", names[79], "repeat spread", rep[79], "HF checkpointing", ck[79],
      "max |g|", ref[1][79].float().abs().max().item())
worst = sorted(range(len(rep)), key=lambda i: -ck[i])[:8]
for i in worst:
    print(f"  {i:3d} {names[i]:60s} repeats {rep[i]:.3g}  HF checkpointing {ck[i]:.3g}")
print("parameters whose repeats moved:", sum(d > 0 for d in rep), "of", len(rep))
