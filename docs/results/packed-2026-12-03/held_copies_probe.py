"""Trainer.gradients with the previous _accumulate (autocast ended after the forward) against
the held-copies one: gradients compared, then seconds alternated, and bytes of _to_copy."""
import argparse, importlib.util, sys, time
from pathlib import Path
sys.path.insert(0, "/work/main/scripts"); sys.path.insert(0, "/work/main")
import torch, bench_round as br
from sapo_node import trainer as new_mod
from sapo_node.node import _fix_mmap_threshold
_fix_mmap_threshold()
spec = importlib.util.spec_from_file_location("old_trainer", "/tmp/w/trainer_before_hold.py")
old_mod = importlib.util.module_from_spec(spec); sys.modules["old_trainer"] = old_mod; spec.loader.exec_module(old_mod)
args = argparse.Namespace(data_dir=Path("/tmp/bench"), model="embedded", threads=None, lora=False)
cfg, policy, synth = br._training_setup(args)
k = int(sys.argv[1]); reps = int(sys.argv[2])
trs = {"old": old_mod.Trainer(policy, cfg.train, cfg.generation.max_new_tokens),
       "new": new_mod.Trainer(policy, cfg.train, cfg.generation.max_new_tokens)}
grads = {}
for name, tr in trs.items():
    tr.gradients(synth[:k]); grads[name] = torch.cat([p.grad.flatten() for p in tr.params]); tr.optimizer.zero_grad(set_to_none=True)
d = (grads["old"] - grads["new"]).abs().max().item()
print(f"gradients: max abs difference {d:.3e}, equal: {torch.equal(grads['old'], grads['new'])}", flush=True)
del grads
from torch.profiler import profile, ProfilerActivity
for name, tr in trs.items():
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        tr.gradients(synth[:k])
    ev = {e.key: e for e in p.key_averages()}
    print(name, "_to_copy calls", ev["aten::_to_copy"].count, f"self cpu copy_ {ev['aten::copy_'].self_cpu_time_total/1e6:.2f} s", flush=True)
tot = {"old": 0.0, "new": 0.0}
for rep in range(reps):
    for name in (("old", "new") if rep % 2 == 0 else ("new", "old")):
        t = time.perf_counter(); trs[name].gradients(synth[:k]); dt = time.perf_counter() - t
        tot[name] += dt; print(name, f"{dt:.2f} s", flush=True)
print({n: round(v, 2) for n, v in tot.items()}, f"old/new {tot['old']/tot['new']:.3f}x")
