import sys, time, argparse, resource, pathlib, torch
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/scripts")
import bench_round as br
from sapo_node.node import _fix_mmap_threshold
from sapo_node.trainer import Trainer
_fix_mmap_threshold()
n, ckpt, length = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
args = argparse.Namespace(data_dir=pathlib.Path("/tmp/bench"), model="embedded")
cfg, policy, samples = br._training_setup(args)
from sapo_node.trainer import Sample
samples = [Sample(s.prompt_ids, (s.completion_ids * 3)[:length], s.advantage) for s in samples]
trainer = Trainer(policy, cfg.train, cfg.generation.max_new_tokens, cfg.generation.temperature)
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
out = [round(rss())]
with br._checkpointing(policy.model, ckpt):
    for _ in range(2):
        s = time.perf_counter(); trainer.step(samples[:n]); out.append((round(rss()), round(time.perf_counter() - s, 2)))
print(n, "ckpt" if ckpt else "no", length, out, flush=True)
