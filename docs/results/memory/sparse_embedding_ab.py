# One-off probe behind docs/benchmarks.md: training steps alternating the tied embedding's
# sparse and dense gradient in one process. Command run:
#   .venv/bin/python docs/results/memory/sparse_embedding_ab.py
import sys, argparse, time, torch
sys.path.insert(0, '/work/main/scripts'); sys.path.insert(0, '/work/main')
import bench_round as br
torch.set_num_threads(1)
args = argparse.Namespace(data_dir=__import__('pathlib').Path('/tmp/bench'))
from sapo_node.trainer import Trainer
cfg, policy, samples = br._training_setup(args)
tr = Trainer(policy, cfg.train, cfg.generation.max_new_tokens)
emb = policy.model.get_input_embeddings()
tr.step(samples)
res = {True: [], False: []}
for i in range(6):
    sp = i % 2 == 0
    emb.sparse = sp
    t = time.perf_counter(); tr.step(samples); res[sp].append(round(time.perf_counter() - t, 2))
print("sparse", res[True], "dense", res[False])
