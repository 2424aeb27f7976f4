"""Benchmark the node's generation path and round overhead on the embedded model.

Prints, for the same batch on the same machine, in one process, interleaved:
  1. generation (the default shape: 4 tasks x 8 completions, the real task prompts):
     tokens/s of the node's path (``sapo_node.train.decode``: each prompt prefilled once, its
     cache shared by its completions, a lean decode loop, on the weights' copy in the
     compute dtype, ``Policy.compute_weights``) against plain ``model.generate`` on every
     row left-padded in float32 (the node's path before issue 10) and, where the node
     computes in bfloat16, plain ``model.generate`` on the same bfloat16 copy (what the
     dtype alone gives); 64 new tokens forced (EOS suppressed) so all make the same
     tokens; the GEMM bound of the model's weight matrices at that batch in float32 and
     in the compute dtype, measured in the same run (the tokens/s if a decode step cost
     only its weight GEMMs); useful tokens/s of the node's path and of plain float32
     generate at natural lengths (rows stop at EOS); prefill one prompt at a time against
     one left-padded batch; with ``--profile-step``, where a decode step's time goes.
  2. a few real rounds of a Node: the share of wall time per round spent
     outside generate/score/train, and the peak RSS.
  3. training: seconds per training step (forward, backward, clip, optimiser step) of the
     node's path (one row per prompt and its completions, a block attention mask, the
     config's dtype, optimiser and micro-batch size), the same with gradient
     checkpointing toggled, vs the previous step (each row carrying its prompt,
     tests/support/unshared.py, in float32, micro-batches of 8; torch's default AdamW
     loop) on the same samples, interleaved, and the max abs difference of their
     gradients (both in float32).
     ``--rss-step new|ckpt|old`` instead runs two training steps alone (the second is the
     first with the optimiser's state) and prints the peak RSS after each; ``ckpt``: the
     node's path with gradient checkpointing. Run it in a fresh process per path.
     ``--heap-steps N`` instead runs N training steps of changing shapes (8-32 of the
     samples, completions cut to 5-64 tokens, a fixed random sequence) and prints after
     each: seconds, resident and peak RSS, and glibc's heap (in use, free but kept). Set
     ``MALLOC_MMAP_THRESHOLD_`` to compare allocator settings (the node's own is 128 KiB,
     ``sapo_node.ops.lifecycle.fix_mmap_threshold``). With ``--compare-threshold BYTES`` each
     step is instead a generation of the default shape and a training step, run once with
     the node's threshold and once with BYTES, in alternating order; it prints tokens/s
     (each run trains, so the generations differ) and training seconds (speed only:
     both share one heap).

SAPO_* environment variables change the config as they do a node's (e.g.
SAPO_TRAIN__MICRO_BATCH_SIZE=8 SAPO_MODEL__GRADIENT_CHECKPOINTING=false).

Usage: python scripts/bench_round.py [--data-dir DIR] [--rounds 3] [--repeats 2]
       [--profile-step] [--skip-rounds] [--model DIR]
       python scripts/bench_round.py --training-only [--repeats 3]
       python scripts/bench_round.py --rss-step new [--lora]
       [MALLOC_MMAP_THRESHOLD_=BYTES] python scripts/bench_round.py --heap-steps 10
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scripts.support.round_memory import measure_heap, measure_training_rss  # noqa: E402
from scripts.support.round_setup import (  # noqa: E402
    checkpointing,
    default_prompts,
    in_float32,
    is_checkpointing,
    previous_optimizer,
    training_setup,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "sapo-bench")
    parser.add_argument(
        "--model", default="embedded", help="Another model directory (the tests' tiny model)."
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--profile-step", action="store_true", help="Also profile one decode step by operator."
    )
    parser.add_argument("--skip-rounds", action="store_true", help="Only the generation part.")
    parser.add_argument("--training-only", action="store_true")
    parser.add_argument("--rss-step", choices=["new", "ckpt", "old"])
    parser.add_argument("--lora", action="store_true", help="With --rss-step: LoRA on.")
    parser.add_argument("--heap-steps", type=int, help="Training steps of changing shapes.")
    parser.add_argument(
        "--compare-threshold", type=int, help="With --heap-steps: time this mmap threshold."
    )
    args = parser.parse_args()

    from sapo_node.logs import configure_logging
    from sapo_node.ops.lifecycle import cap_kernel_caches

    configure_logging()
    cap_kernel_caches()  # as a node's program does, before any matrix product
    if args.rss_step:
        measure_training_rss(args)
        return
    if args.heap_steps:
        measure_heap(args)
        return
    if not args.training_only:
        measure_generation(args)
        if not args.skip_rounds:
            measure_rounds(args)
    if not args.skip_rounds:
        measure_training(args)


def measure_generation(args: argparse.Namespace) -> None:
    """Generation: the node's path (decode.py) against plain generate and the GEMM bound."""
    from sapo_node.train import decode

    cfg, policy, prompts = default_prompts(args)
    gen = cfg.generation
    n, new = gen.completions_per_task, gen.max_new_tokens
    rows = len(prompts) * n
    model, tok = policy.model.eval(), policy.tokenizer
    print(
        f"generation: {len(prompts)} tasks x {n} completions, {new} new tokens forced "
        f"(EOS suppressed), prompts {[len(p) for p in prompts]} tokens, "
        f"torch threads {torch.get_num_threads()}"
    )

    master = contextlib.nullcontext  # the float32 weights: the node's path before issue 10

    def plain(weights=master) -> float:
        # The previous node path: every row in one left-padded model.generate call, float32.
        start = time.perf_counter()
        with torch.inference_mode(), weights():
            ids, mask = policy._left_pad([p for p in prompts for _ in range(n)])
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=tok.pad_token_id,
            )
        return rows * new / (time.perf_counter() - start)

    def node_path() -> float:
        # decode.sample as Policy.generate calls it (weights in the compute dtype, under
        # autocast), with no EOS id: every row runs to the end.
        start = time.perf_counter()
        with torch.inference_mode(), policy.compute_weights():
            out = decode.sample(
                model,
                prompts,
                n,
                max_new_tokens=new,
                sampling=decode.Sampling(gen.temperature, gen.top_k, gen.top_p),
                eos_ids=[],
                device=policy.device,
                max_batch_sequences=gen.max_batch_sequences,
                autocast=policy.autocast,
            )
        made = sum(len(c) for g in out for c in g)
        assert made == rows * new, made
        return made / (time.perf_counter() - start)

    half = policy.dtype != torch.float32
    print(f"  the node computes in {str(policy.dtype).removeprefix('torch.')}")
    weights = _weight_matrices(model)
    runs = {
        "node": node_path,
        "plain": plain,
        "gemm_bound": lambda: rows / _gemm_seconds(weights, rows),
    }
    if half:  # what the dtype alone gives: plain generate and the GEMMs on the same copies
        runs["plain_half"] = lambda: plain(policy.compute_weights)
        runs["gemm_bound_half"] = lambda: rows / _gemm_seconds(weights, rows, policy.dtype)
    forced: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.repeats):  # interleaved, best of N: the machine is noisy
        for k, run in runs.items():
            forced[k].append(run())
    best = {k: max(v) for k, v in forced.items()}
    bound = "gemm_bound_half" if half else "gemm_bound"
    for k in [k for k in forced if k.startswith("gemm")]:
        print(
            f"  {k} at batch {rows}: {best[k]:7.1f} tok/s "
            f"({sum(w.numel() for w in weights) / 1e6:.1f} M weights; runs "
            + ", ".join(f"{v:.1f}" for v in forced[k])
            + ")"
        )
    for k in [k for k in forced if not k.startswith("gemm")]:
        runs_k = ", ".join(f"{v:.1f}" for v in forced[k])
        print(
            f"  {k:10s} forced lengths: {best[k]:7.1f} tok/s, "
            f"{100 * best[k] / best['gemm_bound']:5.1f}% of the float32 GEMM bound"
            + (f", {100 * best[k] / best[bound]:5.1f}% of the {bound}" if half else "")
            + f" (runs {runs_k})"
        )
    print(f"  ratio node/plain (float32), forced lengths: {best['node'] / best['plain']:.2f}x")
    if half:
        print(f"  ratio node/plain_half, forced lengths: {best['node'] / best['plain_half']:.2f}x")

    # Natural lengths: rows stop at EOS. Useful tokens per second, interleaved; plain is
    # the node's previous path (float32 weights, no autocast).
    natural: dict[str, list[float]] = {"node": [], "plain": []}
    for i in range(args.repeats):
        for name in ("node", "plain") if i % 2 == 0 else ("plain", "node"):
            torch.manual_seed(100 + i)
            start = time.perf_counter()
            if name == "node":
                made = policy.generate(prompts, gen, n=n).new_tokens
            else:
                with in_float32(policy):
                    out = policy.generate_plain(prompts, gen, n=n)
                made = sum(len(c) for g in out for c in g)
            natural[name].append(made / (time.perf_counter() - start))
    nb = {k: max(v) for k, v in natural.items()}
    print(
        f"  natural lengths: node {nb['node']:.1f}, plain {nb['plain']:.1f} useful tok/s, "
        f"ratio {nb['node'] / nb['plain']:.2f}x (runs node "
        + ", ".join(f"{v:.1f}" for v in natural["node"])
        + "; plain "
        + ", ".join(f"{v:.1f}" for v in natural["plain"])
        + ")"
    )
    _measure_prefill(model, prompts, args.repeats)
    if args.profile_step:
        with torch.inference_mode(), policy.compute_weights():  # the node's weights
            _profile_decode_step(model, prompts, n)


def _weight_matrices(model) -> list[torch.Tensor]:
    """Every weight matrix a decode step multiplies by: the layers' and the LM head."""
    head = model.get_output_embeddings().weight
    mats = [p for name, p in model.named_parameters() if p.dim() == 2 and "embed" not in name]
    if not any(m is head for m in mats):
        mats.append(head)
    return [m.detach() for m in mats]


def _gemm_seconds(
    weights: list[torch.Tensor], rows: int, dtype: torch.dtype = torch.float32
) -> float:
    """Seconds for one pass of [rows, in] @ W.T over every weight matrix (best of 3)."""
    weights = [w.to(dtype) for w in weights]
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=dtype) for w in weights}
    best = float("inf")
    with torch.inference_mode():
        for w in weights:  # warm-up
            inputs[w.shape[1]] @ w.t()
        for _ in range(3):
            start = time.perf_counter()
            for w in weights:
                inputs[w.shape[1]] @ w.t()
            best = min(best, time.perf_counter() - start)
    return best


def _measure_prefill(model, prompts: list[list[int]], repeats: int) -> None:
    """Prefill each prompt alone (decode.py's choice) vs one left-padded batch of them."""

    def alone() -> float:
        start = time.perf_counter()
        for p in prompts:
            model(input_ids=torch.tensor([p]), use_cache=True, logits_to_keep=1)
        return time.perf_counter() - start

    def padded() -> float:
        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        position = (mask.cumsum(-1) - 1).clamp(min=0)
        start = time.perf_counter()
        model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=position,
            use_cache=True,
            logits_to_keep=1,
        )
        return time.perf_counter() - start

    times: dict[str, list[float]] = {"alone": [], "padded": []}
    with torch.inference_mode():
        for _ in range(max(2, repeats)):
            times["alone"].append(alone())
            times["padded"].append(padded())
    best = {k: min(v) for k, v in times.items()}
    print(
        f"  prefill of the {len(prompts)} prompts: one by one {best['alone']:.2f} s, "
        f"one left-padded batch {best['padded']:.2f} s"
    )


def _profile_decode_step(model, prompts: list[list[int]], n: int) -> None:
    """Where a decode step's time goes (torch.profiler over 16 steps of decode.sample)."""
    from torch.profiler import ProfilerActivity, profile

    from sapo_node.train import decode

    def run(steps: int) -> None:
        decode.sample(
            model,
            prompts,
            n,
            max_new_tokens=steps,
            sampling=decode.Sampling(),
            eos_ids=[],
            device=torch.device("cpu"),
            max_batch_sequences=len(prompts) * n,
        )

    with torch.inference_mode():
        run(2)
        with profile(activities=[ProfilerActivity.CPU]) as short:
            run(1)  # prefill and the first draw only
        with profile(activities=[ProfilerActivity.CPU]) as long:
            run(17)
    prefill = {e.key: e.self_cpu_time_total for e in short.key_averages()}
    rows = []
    for e in long.key_averages():
        rows.append((e.key, (e.self_cpu_time_total - prefill.get(e.key, 0)) / 16))
    total = sum(t for _, t in rows)
    print(f"  one decode step at batch {len(prompts) * n}: {total / 1e3:.1f} ms (profiled)")
    for key, t in sorted(rows, key=lambda r: -r[1])[:10]:
        print(f"    {key:50s} {t / 1e3:7.2f} ms  {100 * t / total:5.1f}%")


def measure_rounds(args: argparse.Namespace) -> None:
    from sapo_node.build import build_node
    from sapo_node.config import load_config

    run_dir = args.data_dir / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    if (args.data_dir / "models").is_dir():
        shutil.copytree(args.data_dir / "models", run_dir / "models")
    node_cfg = load_config(
        overrides={
            "model": {"name": args.model},
            "node": {
                "data_dir": str(run_dir),
                "rounds": args.rounds,
                "seed": 7,
                "checkpoint_every": 1000,
            },
        },
        environ={},
    )
    from sapo_node.ops.lifecycle import fix_mmap_threshold

    fix_mmap_threshold()  # as `sapo-node start` does
    node = build_node(node_cfg)
    try:
        node.run()
    finally:
        node.close()
    from sapo_node.metrics import read_metrics

    rows = read_metrics(run_dir / "metrics.jsonl")
    # Wall time of round k = time between the records of rounds k-1 and k: it includes
    # everything the loop does (task making, pool, records, logs, metrics fsync).
    wall = inside = 0.0
    for prev, r in zip(rows, rows[1:], strict=False):
        w = r["time"] - prev["time"]
        t = {p: r[f"phase_s/{p}"] for p in ("generate", "score", "train")}
        phases = t["generate"] + t["score"] + t["train"]
        wall, inside = wall + w, inside + phases
        print(
            f"  round {r['round']}: {w:.1f} s wall (generate {t['generate']:.1f}, "
            f"score {t['score']:.2f}, train {t['train']:.1f}), outside "
            f"{100 * (1 - phases / w):.2f}%"
        )
    print(f"share of round time outside generate/score/train: {100 * (1 - inside / wall):.2f}%")
    print(f"peak RSS: {max(r['memory/peak_rss_mb'] for r in rows):.0f} MiB")


def measure_training(args: argparse.Namespace) -> None:
    from sapo_node.train.trainer import Trainer
    from tests.support.unshared import unshared_backward

    cfg, policy, samples = training_setup(args)
    s, new = cfg.train, cfg.generation.max_new_tokens
    prompt_tokens = sum(len(x.prompt_ids) for x in samples)
    completion_tokens = sum(len(x.completion_ids) for x in samples)
    groups = len({tuple(x.prompt_ids) for x in samples})
    dup = (prompt_tokens - prompt_tokens * groups // len(samples)) / (
        prompt_tokens + completion_tokens
    )
    print(
        f"training: {len(samples)} rows, prompts {len(samples[0].prompt_ids)} tokens, "
        f"completions {completion_tokens / len(samples):.1f} tokens on average, "
        f"micro_batch_size {s.micro_batch_size}; duplicate prompt tokens in the unshared "
        f"step: {100 * dup:.0f}%"
    )
    trainer = Trainer(policy, s, new, cfg.generation.temperature)
    params = trainer.params
    before = s.model_copy(update={"micro_batch_size": 8})  # the release's default

    # Equal gradients: both paths in float32 (the node's own dtype adds its rounding).
    with in_float32(policy), checkpointing(policy.model, False):
        start = time.perf_counter()
        trainer.gradients(samples)
        t_new = time.perf_counter() - start
        shared = [p.grad.clone() for p in params]
        start = time.perf_counter()
        unshared_backward(policy, samples, s, new)
        t_old = time.perf_counter() - start
    print(f"  forward+backward only, float32: old {t_old:.2f} s, new {t_new:.2f} s", flush=True)
    diff = max(float((a - p.grad).abs().max()) for a, p in zip(shared, params, strict=True))
    scale = max(float(p.grad.abs().max()) for p in params)
    del shared
    print(f"  max abs gradient difference new vs old: {diff:.2e} (largest gradient {scale:.2e})")
    print(
        f"  the node computes in {str(policy.dtype).removeprefix('torch.')}, its optimiser: "
        f"{type(trainer.optimizer).__name__}; old: float32, torch's AdamW loop"
    )

    old_optimizer = previous_optimizer(params, s)

    def old_step() -> float:
        start = time.perf_counter()
        with in_float32(policy), checkpointing(policy.model, False):
            unshared_backward(policy, samples, before, new)
        torch.nn.utils.clip_grad_norm_(params, s.grad_clip)
        old_optimizer.step()
        old_optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    def new_step() -> float:
        start = time.perf_counter()
        trainer.step(samples)
        return time.perf_counter() - start

    ckpt = is_checkpointing(policy.model)
    other = "without" if ckpt else "with"

    def toggled_step() -> float:
        with checkpointing(policy.model, not ckpt):
            return new_step()

    print(f"  new: micro_batch_size {s.micro_batch_size}, gradient checkpointing {ckpt}")
    times: dict[str, list[float]] = {"old": [], "new": [], "toggled": []}
    for _ in range(args.repeats):  # interleaved, best of N: the machine is noisy
        times["old"].append(old_step())
        times["new"].append(new_step())
        times["toggled"].append(toggled_step())
        print(
            f"  step: old {times['old'][-1]:.2f} s, new {times['new'][-1]:.2f} s, "
            f"new {other} gradient checkpointing {times['toggled'][-1]:.2f} s",
            flush=True,
        )
    best = {k: min(v) for k, v in times.items()}
    print(
        f"  s/step: old (unshared) {best['old']:.2f}, new (shared prompts) {best['new']:.2f}, "
        f"ratio {best['old'] / best['new']:.2f}x; {other} gradient checkpointing "
        f"{best['toggled']:.2f} ({best['toggled'] / best['new']:.2f}x new)   (all: {times})"
    )

    # The optimiser step alone, on the same gradients: the previous loop, the node's
    # optimiser, and torch's fused kernel (the node's with float32 moments).
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    fused = torch.optim.AdamW(params, lr=s.lr, betas=s.betas, fused=True)
    optimizers = {"loop": old_optimizer, "node": trainer.optimizer, "fused": fused}
    steps: dict[str, list[float]] = {k: [] for k in optimizers}
    for _ in range(3):
        for name, optimizer in optimizers.items():
            start = time.perf_counter()
            optimizer.step()
            steps[name].append(time.perf_counter() - start)
    print(
        "  optimiser step alone: "
        + ", ".join(f"{k} {min(v):.3f} s" for k, v in steps.items())
        + f" (the node's: {type(trainer.optimizer).__name__})"
    )


if __name__ == "__main__":
    main()
