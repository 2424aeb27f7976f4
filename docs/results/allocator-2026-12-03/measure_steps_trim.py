
import random, resource, sys
from pathlib import Path
from sapo_node.config import LoraSection, TrainSection
from sapo_node.node import _fix_mmap_threshold
from sapo_node.policy import load_policy
from sapo_node.trainer import Sample, Trainer
n, lora, cache = int(sys.argv[1]), sys.argv[2] == "lora", Path(sys.argv[3])
_fix_mmap_threshold()  # the node's allocator setting
policy = load_policy("embedded", device="cpu", dtype="float32", lora=LoraSection(enabled=lora),
                     cache_dir=cache, gradient_checkpointing=sys.argv[4:] == ["ckpt"])
trainer = Trainer(policy, TrainSection(micro_batch_size=8, optimizer_state="float32"), n)
rng = random.Random(0)
samples = []
for _ in range(2):
    prompt = [rng.randrange(1000, 40000) for _ in range(104)]
    samples += [Sample(prompt, [rng.randrange(1000, 40000) for _ in range(n)],
                       rng.choice([-1.0, 1.0])) for _ in range(8)]
import os
from sapo_node.node import _trim_heap
for _ in range(3):
    trainer.step(samples)
    if os.environ.get('TRIM'): _trim_heap()
    print('step', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, flush=True)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
