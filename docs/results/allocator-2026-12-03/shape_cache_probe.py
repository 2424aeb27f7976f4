"""Two fixed shapes alternated (A B A B ...): with oneDNN/ideep caches of 16, is every switch a rebuild?"""
import argparse, os, sys, time
from pathlib import Path
sys.path.insert(0, "/work/main/scripts"); sys.path.insert(0, "/work/main")
import torch, bench_round as br
from sapo_node.node import _fix_mmap_threshold
from sapo_node.trainer import Sample, Trainer
_fix_mmap_threshold()
args = argparse.Namespace(data_dir=Path("/tmp/bench"), model="embedded", threads=None, lora=False)
cfg, policy, samples = br._training_setup(args)
tr = Trainer(policy, cfg.train, cfg.generation.max_new_tokens)
A = [Sample(x.prompt_ids, (x.completion_ids * 3)[:40], x.advantage) for x in samples[:8]]
B = [Sample(x.prompt_ids, (x.completion_ids * 3)[:44], x.advantage) for x in samples[:8]]
mode = os.environ["MODE"]
seq = [A, B] * 4 if mode == "alternate" else [A] * 4 + [B] * 4
tr.step(A); tr.step(B)
ts = []
for b in seq:
    t = time.perf_counter(); tr.step(b); ts.append(time.perf_counter() - t)
print(mode, os.environ.get("LRU_CACHE_CAPACITY"), " ".join(f"{x:.2f}" for x in ts), f"sum {sum(ts):.1f}", flush=True)
