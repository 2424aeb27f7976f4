# One-off probe behind docs/benchmarks.md ("Where it goes"): peak RSS of two training steps,
# with 'trim': glibc malloc_trim(0) before every micro-batch's loss and after every step. Run:
#   .venv/bin/python docs/results/memory/malloc_trim_probe.py x; .venv/bin/python docs/results/memory/malloc_trim_probe.py trim
import sys, argparse, resource, ctypes, torch
sys.path.insert(0, '/work/main/scripts'); sys.path.insert(0, '/work/main')
import bench_round as br
from pathlib import Path
args = argparse.Namespace(data_dir=Path('/tmp/bench'), lora=False)
from sapo_node.trainer import Trainer
from sapo_node import grpo
cfg, policy, samples = br._training_setup(args)
if "ckpt" in sys.argv: policy.model.gradient_checkpointing_enable()
libc = ctypes.CDLL("libc.so.6")
tr = Trainer(policy, cfg.train, cfg.generation.max_new_tokens)
if "trim" in sys.argv:
    orig = grpo.clipped_surrogate
    import sapo_node.trainer as T
    def wrapped(*a, **k):
        libc.malloc_trim(0)
        return orig(*a, **k)
    T.grpo = type("G", (), {**{n: getattr(grpo, n) for n in dir(grpo) if not n.startswith("__")}, "clipped_surrogate": staticmethod(wrapped)})
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
out = [peak()]
for _ in range(2):
    tr.step(samples)
    if "trim" in sys.argv: libc.malloc_trim(0)
    out.append(peak())
print(sys.argv[1:], out, flush=True)
