import argparse, os, sys, time
from pathlib import Path
ROOT = Path("/work/main")
sys.path.insert(0, str(ROOT / "scripts")); sys.path.insert(0, str(ROOT))
import torch
import bench_round as br
from sapo_node.node import _fix_mmap_threshold
from sapo_node.trainer import Trainer
from torch.profiler import profile, ProfilerActivity
_fix_mmap_threshold()
args = argparse.Namespace(data_dir=Path("/tmp/bench"), model="embedded", threads=None, lora=False)
cfg, policy, samples = br._training_setup(args)
trainer = Trainer(policy, cfg.train, cfg.generation.max_new_tokens)
label = os.environ.get("LABEL", "")
trainer.step(samples[:8])  # warm-up
out = []
for k in (8, 16, 8, 16):
    t = time.perf_counter(); trainer.step(samples[:k]); out.append((k, time.perf_counter() - t))
import resource; print("minflt", resource.getrusage(resource.RUSAGE_SELF).ru_minflt, end=" "); print(label, policy.dtype, "ckpt", cfg.model.gradient_checkpointing, cfg.train.optimizer_state, [f"{k}:{s:.2f}" for k, s in out], flush=True)
if os.environ.get("PROFILE"):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.step(samples[:8])
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
