"""A/B in one process: the head cast per chunk (trainer_old.py = 2a5c0c1's) vs once per micro-batch."""
import argparse, importlib.util, resource, sys, time
from pathlib import Path
sys.path.insert(0, "/work/main/scripts"); sys.path.insert(0, "/work/main")
import torch, bench_round as br
from sapo_node.node import _fix_mmap_threshold
from sapo_node.trainer import Trainer as New
_fix_mmap_threshold()
spec = importlib.util.spec_from_file_location("trainer_old", "/tmp/w/trainer_old.py"); old = importlib.util.module_from_spec(spec); sys.modules["trainer_old"] = old; spec.loader.exec_module(old)
args = argparse.Namespace(data_dir=Path("/tmp/bench"), model="embedded", threads=None, lora=False)
cfg, policy, samples = br._training_setup(args)
tr = {"old": old.Trainer(policy, cfg.train, cfg.generation.max_new_tokens), "new": New(policy, cfg.train, cfg.generation.max_new_tokens)}
emb = policy.model.get_input_embeddings().weight
grads = {}
for name, t in tr.items():  # gradients on the same weights, no step
    t.gradients(samples[:16]); grads[name] = [p.grad.detach().clone() for p in t.params]; t.optimizer.zero_grad(set_to_none=True)
rel = [float((a - b).norm() / b.norm()) for a, b in zip(grads["new"], grads["old"])]
print("relative gradient difference new vs old: embedding/head", f"{rel[0]:.2e}", "max over all", f"{max(rel):.2e}", flush=True)
# old against itself (bfloat16 nondeterminism floor)
tr["old"].gradients(samples[:16]); again = [p.grad.detach().clone() for p in tr["old"].params]; tr["old"].optimizer.zero_grad(set_to_none=True)
rel0 = [float((a - b).norm() / b.norm()) for a, b in zip(again, grads["old"])]
print("old vs old again: embedding", f"{rel0[0]:.2e}", "max", f"{max(rel0):.2e}", flush=True)
tot = {"old": [0.0, 0], "new": [0.0, 0]}
for rep in range(3):
    for k in (8, 16):
        for name in (["old", "new"] if rep % 2 == 0 else ["new", "old"]):
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt; t0 = time.perf_counter()
            tr[name].step(samples[:k])
            dt = time.perf_counter() - t0; f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
            tot[name][0] += dt; tot[name][1] += f
            print(f"{name} {k}: {dt:.2f} s, {f} faults", flush=True)
print({k: (round(v[0], 1), v[1]) for k, v in tot.items()}, "old/new time", round(tot["old"][0] / tot["new"][0], 3))
