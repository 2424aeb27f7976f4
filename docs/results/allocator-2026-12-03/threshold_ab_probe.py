"""Training steps under several glibc mmap thresholds in one process, rotated, the heap trimmed
after each step as the node does; seconds and minor page faults per step. (2026-12-03)"""
import argparse, ctypes, resource, sys, time
from pathlib import Path
sys.path.insert(0, "/work/main/scripts"); sys.path.insert(0, "/work/main")
import torch, bench_round as br
from sapo_node.trainer import Trainer
libc = ctypes.CDLL("libc.so.6")
args = argparse.Namespace(data_dir=Path("/tmp/bench"), model="embedded", threads=None, lora=False)
cfg, policy, samples = br._training_setup(args)
tr = Trainer(policy, cfg.train, cfg.generation.max_new_tokens)
tr.step(samples[:8])
thresholds = [int(x) for x in sys.argv[1:]]
tot = {t: [0.0, 0] for t in thresholds}
for rep in range(2):
    for k in (8, 16, 8, 16):
        order = thresholds if rep % 2 == 0 else thresholds[::-1]
        for t in order:
            libc.mallopt(-3, t); libc.malloc_trim(0)
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt; t0 = time.perf_counter()
            tr.step(samples[:k]); libc.malloc_trim(0)
            dt = time.perf_counter() - t0; f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
            tot[t][0] += dt; tot[t][1] += f
            print(f"threshold {t} {k} sequences: {dt:.2f} s, {f} faults", flush=True)
base = tot[thresholds[0]][0]
for t, (s, f) in tot.items(): print(f"threshold {t}: {s:.1f} s in all ({s / base:.3f}x the first), {f} faults")
