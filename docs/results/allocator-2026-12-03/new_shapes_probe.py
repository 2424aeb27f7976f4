"""Does a new shape cost? Training steps on 8 samples: a fresh completion length each step
against the same samples repeated, alternating, one process. (2026-12-03)"""
import argparse, random, resource, sys, time
from pathlib import Path
sys.path.insert(0, "/work/main/scripts"); sys.path.insert(0, "/work/main")
import torch, bench_round as br
from sapo_node.node import _fix_mmap_threshold
from sapo_node.trainer import Sample, Trainer
_fix_mmap_threshold()
args = argparse.Namespace(data_dir=Path("/tmp/bench"), model="embedded", threads=None, lora=False)
cfg, policy, samples = br._training_setup(args)
tr = Trainer(policy, cfg.train, cfg.generation.max_new_tokens)
same = samples[:8]
tr.step(same)
rng = random.Random(0)
for i in range(4):
    cut = rng.randint(20, 60)
    fresh = [Sample(x.prompt_ids, (x.completion_ids * 3)[: cut + j], x.advantage) for j, x in enumerate(samples[:8])]
    for name, batch in (("repeat", same), ("new shapes", fresh)):
        t = time.perf_counter(); tr.step(batch); print(f"{name}: {time.perf_counter() - t:.2f} s", flush=True)
