import os, sys, random, resource, time, ctypes, argparse
from pathlib import Path
sys.path.insert(0, "/work/main/scripts"); sys.path.insert(0, "/work/main")
import torch, bench_round as br
from sapo_node.node import _fix_mmap_threshold
from sapo_node.trainer import Sample, Trainer
_fix_mmap_threshold()
libc = ctypes.CDLL("libc.so.6")
args = argparse.Namespace(data_dir=Path("/tmp/bench"), model="embedded", threads=None, lora=False)
cfg, policy, samples = br._training_setup(args)
tr = Trainer(policy, cfg.train, cfg.generation.max_new_tokens)
rng = random.Random(0)
batches = [[Sample(x.prompt_ids, (x.completion_ids * 3)[: rng.randint(5, 64)], x.advantage) for x in samples[: rng.choice([8, 16, 24, 32])]] for _ in range(int(os.environ.get("STEPS", "10")))]
trim = os.environ.get("TRIM") == "1"
print("threshold", os.environ.get("MALLOC_MMAP_THRESHOLD_", "node"), "trim", trim, flush=True)
for k, b in enumerate(batches):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt; t = time.perf_counter()
    tr.step(b)
    if trim: libc.malloc_trim(0)
    dt = time.perf_counter() - t; f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"step {k} ({len(b)}): {dt:.1f} s faults {f1-f0} RSS {br._rss_mb():.0f} peak {peak:.0f}", flush=True)
