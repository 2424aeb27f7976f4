import sys, time, argparse, torch
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/scripts")
import bench_round as br
from sapo_node.trainer import Trainer
args = argparse.Namespace(data_dir=__import__("pathlib").Path("/tmp/bench"), model="embedded")
cfg, policy, samples = br._training_setup(args)
print("dtype", policy.dtype, "threads", torch.get_num_threads())
trainer = Trainer(policy, cfg.train, cfg.generation.max_new_tokens, cfg.generation.temperature)
def t(samples, ckpt):
    with br._checkpointing(policy.model, ckpt):
        s = time.perf_counter(); trainer.gradients(samples); return time.perf_counter() - s
for n in (8, 16, 32):
    sub = samples[:n]
    t(sub, True)
    res = {True: [], False: []}
    for _ in range(3):
        for c in (True, False):
            res[c].append(t(sub, c))
    print(n, "ckpt", [round(x,2) for x in res[True]], "no", [round(x,2) for x in res[False]], "ratio", round(min(res[True])/min(res[False]),2), flush=True)
if "--profile" in sys.argv:
    from torch.profiler import profile
    sub = samples[:16]
    with br._checkpointing(policy.model, True):
        with profile() as prof:
            trainer.gradients(sub)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
