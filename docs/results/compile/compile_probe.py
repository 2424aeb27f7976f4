"""One-off probe behind docs/benchmarks.md ("torch.compile"): the node's decode path
(``sapo_node.decode.sample``, 4 default prompts x 8, 64 tokens forced) with the model
eager and under ``torch.compile(dynamic=True)``, interleaved, one torch thread.

    .venv/bin/python -u docs/results/compile/compile_probe.py
"""

import argparse
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(REPO / "scripts"), str(REPO)]
import bench_round as br  # noqa: E402

from sapo_node import decode  # noqa: E402

if __name__ == "__main__":
    torch.set_num_threads(1)
    cfg, policy, prompts = br._default_prompts(argparse.Namespace(data_dir=Path("/tmp/bench")))
    gen, model = cfg.generation, policy.model.eval()

    def run(m) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            out = decode.sample(
                m,
                prompts,
                gen.completions_per_task,
                max_new_tokens=gen.max_new_tokens,
                sampling=decode.Sampling(gen.temperature, gen.top_k, gen.top_p),
                eos_ids=[],
                device=policy.device,
                max_batch_sequences=gen.max_batch_sequences,
            )
        return sum(len(c) for g in out for c in g) / (time.perf_counter() - start)

    compiled = torch.compile(model, dynamic=True)
    start = time.perf_counter()
    first = run(compiled)
    print(f"compiled, first call (compiles): {time.perf_counter() - start:.1f} s, {first:.1f} tok/s", flush=True)
    for i in range(2):
        e, c = run(model), run(compiled)
        print(f"pair {i}: eager {e:.1f} tok/s, compiled {c:.1f} tok/s, ratio {c / e:.2f}x", flush=True)
