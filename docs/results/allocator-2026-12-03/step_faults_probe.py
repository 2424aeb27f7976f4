import resource, sys, time
from pathlib import Path
sys.path.insert(0, "/work/main/scripts"); sys.path.insert(0, "/work/main")
import argparse, torch
import bench_round as br
from sapo_node.node import _fix_mmap_threshold
from sapo_node.trainer import Trainer
_fix_mmap_threshold()
args = argparse.Namespace(data_dir=Path("/tmp/bench"), model="embedded", threads=None, lora=False)
cfg, policy, samples = br._training_setup(args)
import sapo_node.trainer as T, os; T.POSITIONS_PER_CALL = int(os.environ.get("PPC", "64"))
tr = Trainer(policy, cfg.train, cfg.generation.max_new_tokens)
tr.step(samples[:8])
def f(): return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for k in (8, 16):
    plan = tr._plan(samples[:k], None, None)
    a = f(); t0 = time.perf_counter(); tr._accumulate(plan, lambda: False); b = f(); t1 = time.perf_counter()
    tr._apply_gradients(); c = f(); t2 = time.perf_counter()
    tr.optimizer.zero_grad(set_to_none=True)
    print(k, "fwd+bwd faults", b - a, f"{t1-t0:.2f}s", "clip+opt", c - b, f"{t2-t1:.2f}s", flush=True)
from torch.profiler import profile, ProfilerActivity
plan = tr._plan(samples[:8], None, None)
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
    tr._accumulate(plan, lambda: False)
tr.optimizer.zero_grad(set_to_none=True)
ka = prof.key_averages()
rows = sorted(ka, key=lambda e: -e.self_cpu_memory_usage)[:20]
tot = sum(max(e.self_cpu_memory_usage, 0) for e in ka)
print("total positive self alloc MiB", tot / 2**20)
for e in rows: print(f"{e.key[:60]:60s} {e.self_cpu_memory_usage/2**20:10.1f} MiB {e.count:6d} calls")
