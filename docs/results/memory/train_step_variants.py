# One-off probe behind docs/benchmarks.md ("Where it goes"): peak RSS after loading and after
# two training steps of the --rss-step set-up, one variant per fresh process. Commands run:
#   for v in base sparse mb4 mb2; do .venv/bin/python docs/results/memory/train_step_variants.py $v; done
#   MALLOC_ARENA_MAX=1 .venv/bin/python docs/results/memory/train_step_variants.py base
#   GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1048576 .venv/bin/python docs/results/memory/train_step_variants.py base
import sys, argparse, time, torch, resource
sys.path.insert(0, '/work/main/scripts'); sys.path.insert(0, '/work/main')
import bench_round as br
torch.set_num_threads(1)
variant = sys.argv[1]
args = argparse.Namespace(data_dir=__import__('pathlib').Path('/tmp/bench'))
from sapo_node.trainer import Trainer
cfg, policy, samples = br._training_setup(args)
if variant == "sparse":
    policy.model.get_input_embeddings().sparse = True
train = cfg.train
if variant.startswith("mb"):
    train = train.model_copy(update={"micro_batch_size": int(variant[2:])})
if variant == "ckpt":
    policy.model.gradient_checkpointing_enable()
tr = Trainer(policy, train, cfg.generation.max_new_tokens)
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
out = [rss()]
ts = []
for i in range(2):
    t = time.perf_counter(); tr.step(samples); ts.append(round(time.perf_counter() - t, 1)); out.append(rss())
print(variant, "peak RSS MiB after load/step1/step2:", out, "s/step", ts, flush=True)
