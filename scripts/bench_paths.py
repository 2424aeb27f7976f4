"""Each CPU path of docs/benchmarks.md ("CPU paths") against its plain path, in one process.

For every path that can be switched within a process, the node's default and the path
switched off run alternately (the order swapped every repeat, one warm-up run of each
first, not counted) on the same inputs: the 4 real task prompts x 8 completions of
``scripts/bench_round.py`` for generation (64 new tokens forced: EOS ignored) and its
samples (4 prompts x 8 completions of 18-42 tokens) for training. Each repeat gives a
ratio, plain over the path (above 1: the path wins); the script prints the median and the
spread (lowest-highest) of the per-repeat ratios, the measure each is about (speed of the
phase the path changes; the peak memory of that phase above its start, sampled from
/proc every 2 ms, and its minor page faults), and the equivalence of the two: greedy
tokens identical or not and the largest difference of the logits (generation), of the
gradients (training), of the weights after one optimiser step (the moments' dtype).

Paths:
  bf16_compute        model.dtype: bfloat16 under autocast against float32 (generation and
                      a training step; not equivalent by design: bfloat16 rounding)
  packed_weights      generation.packed_weights
  preallocated_cache  generation.preallocated_cache
  decode_mask         generation.decode_mask (the default prompts, and the same cut to
                      one length: transformers drops an all-visible mask)
  chunked_head        train.chunked_head (forward and backward of the default step)
  unchecked_small     train.checkpoint_above_tokens: a micro-batch of 2 groups under the
                      threshold, without gradient checkpointing against with it
  compact_adam        train.optimizer_state: bfloat16 moments against torch's fused AdamW

The process-wide settings (glibc's mmap threshold, oneDNN's and ideep's cache caps) hold
for the whole process and are set here as a node sets them (``lifecycle``): they are not
switched in-process and not measured here.

SAPO_* variables in the environment change the config as they change a node's: with
SAPO_MODEL__LORA__ENABLED=true the training paths are measured on a LoRA step.

Usage: python scripts/bench_paths.py [--model DIR] [--data-dir DIR] [--repeats 3] [--threads N]
       [--only NAME,...] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.support.measure import PeakRss, timed  # noqa: E402
from scripts.support.paths_equivalence import (  # noqa: E402
    generation_equivalence,
    grad_equivalence,
    grads,
    relative_diff,
)
from scripts.support.round_setup import (  # noqa: E402
    checkpointing,
    in_float32,
    is_checkpointing,
    training_setup,
)

PATHS = (
    "bf16_compute",
    "packed_weights",
    "preallocated_cache",
    "decode_mask",
    "chunked_head",
    "unchecked_small",
    "compact_adam",
)
# Equivalence tolerances: the largest difference relative to the largest value of the
# reference (logits, gradients; for the optimiser, the largest update).
TOLERANCE = {
    "bf16_compute": 0.1,  # bfloat16 against float32: a different rounding, not a bug
    "packed_weights": 1e-2,  # bfloat16 products in another blocking
    "preallocated_cache": 1e-2,
    "decode_mask": 1e-2,
    "chunked_head": 2e-2,  # the head's gradient summed in bfloat16 chunk by chunk
    "unchecked_small": 1e-3,  # the same computation, recomputed or kept
    "compact_adam": 2e-2,  # moments rounded to bfloat16 (8 bits of mantissa)
}


def base_name(name: str) -> str:
    """The path a result is about: ``bf16_compute_training`` -> ``bf16_compute``."""
    return name.removesuffix("_training").removesuffix("_one_length")


def alternate(runs: dict[str, Callable[[], dict]], repeats: int) -> dict[str, list[dict]]:
    """Each run once as a warm-up, then ``repeats`` times, the order reversed every
    repeat. A run returns its figures: {"s": seconds, ...}."""
    for run in runs.values():
        run()
    out: dict[str, list[dict]] = {k: [] for k in runs}
    for i in range(repeats):
        for name in list(runs) if i % 2 == 0 else list(runs)[::-1]:
            out[name].append(runs[name]())
    return out


def summary(on: list[dict], off: list[dict], key: str = "s") -> dict:
    """Per-repeat ratios off/on of ``key`` (seconds or MiB: above 1, the path wins)."""
    ratios = [b[key] / a[key] if a[key] > 0 else math.inf for a, b in zip(on, off, strict=True)]
    return {
        "ratio": statistics.median(ratios),
        "spread": [min(ratios), max(ratios)],
        "ratios": ratios,
    }


# --- generation -------------------------------------------------------------------------


def generation_runs(policy, prompts, gen, new_tokens):
    """run(switches) -> {"s", "tok_s", "peak_mib", "faults"}: one forced-length generation."""
    from sapo_node.train import decode

    n = gen.completions_per_task
    sampling = decode.Sampling(gen.temperature, gen.top_k, gen.top_p)

    def run(packed=True, preallocated=True, mask=True, float32=False, rows=prompts) -> dict:
        torch.manual_seed(0)
        dtype = in_float32(policy) if float32 else contextlib.nullcontext()
        with PeakRss() as mem, dtype:
            start = time.perf_counter()
            with torch.inference_mode(), policy.compute_weights(packed=packed):
                out = decode.sample(
                    policy.model.eval(),
                    rows,
                    n,
                    max_new_tokens=new_tokens,
                    sampling=sampling,
                    eos_ids=[],
                    device=policy.device,
                    max_batch_sequences=gen.max_batch_sequences,
                    autocast=policy.autocast,
                    preallocated_cache=preallocated,
                    decode_mask=mask,
                )
            seconds = time.perf_counter() - start
        made = sum(len(c) for g in out for c in g)
        return {"s": seconds, "tok_s": made / seconds, "peak_mib": mem.above, "faults": mem.faults}

    return run


def measure(args: argparse.Namespace) -> dict:
    from sapo_node.ops.lifecycle import cap_kernel_caches, fix_mmap_threshold
    from sapo_node.train.optim import CompactAdam
    from sapo_node.train.trainer import Trainer

    cap_kernel_caches()  # as a node's program does, before any product
    fix_mmap_threshold()
    cfg, policy, samples = training_setup(args)
    prompts = [list(p) for p in dict.fromkeys(tuple(x.prompt_ids) for x in samples)]
    gen = cfg.generation
    new = args.new_tokens or gen.max_new_tokens
    only = set(args.only.split(",")) if args.only else set(PATHS)
    unknown = only - set(PATHS)
    if unknown:
        raise SystemExit(f"unknown paths {sorted(unknown)}; known: {', '.join(PATHS)}")
    half = policy.dtype != torch.float32
    packs = half and _packs(policy)
    results: dict[str, dict] = {}
    print(
        f"model {args.model}, compute dtype {str(policy.dtype).removeprefix('torch.')}, "
        f"torch threads {torch.get_num_threads()}, {args.repeats} repeats; generation: "
        f"{len(prompts)} prompts {[len(p) for p in prompts]} x {gen.completions_per_task}, "
        f"{new} new tokens forced",
        flush=True,
    )

    # Generation: the default against each switch off, in one rotation.
    run = generation_runs(policy, prompts, gen, new)
    arms: dict[str, Callable[[], dict]] = {"default": run}
    offs = {
        "bf16_compute": {"float32": True},
        "packed_weights": {"packed": False},
        "preallocated_cache": {"preallocated": False},
        "decode_mask": {"mask": False},
    }
    applies = {"bf16_compute": half, "packed_weights": packs}
    for name, off in offs.items():
        if name in only and applies.get(name, True):
            arms[name] = lambda off=off: run(**off)
    if len(arms) > 1:
        times = alternate(arms, args.repeats)
        for name in list(arms)[1:]:
            res = summary(times["default"], times[name])
            mem = summary(times["default"], times[name], "peak_mib")
            results[name] = {
                "phase": "generation",
                "measure": "seconds of a forced-length generation (tok/s in runs)",
                **res,
                "on": times["default"],
                "off": times[name],
                "memory_ratio": mem["ratio"],
                "memory_spread": mem["spread"],
                "equivalence": generation_equivalence(
                    policy, prompts, args.equivalence_steps, **offs[name]
                ),
            }
            _print(name, results[name])
    if "decode_mask" in only:  # prompts of one length: the case the mask is for
        width = min(len(p) for p in prompts)
        level = [p[len(p) - width :] for p in prompts]
        times = alternate(
            {"default": lambda: run(rows=level), "off": lambda: run(rows=level, mask=False)},
            args.repeats,
        )
        results["decode_mask_one_length"] = {
            "phase": "generation",
            "measure": f"seconds of a forced-length generation, prompts cut to {width} tokens",
            **summary(times["default"], times["off"]),
            "on": times["default"],
            "off": times["off"],
            "equivalence": generation_equivalence(
                policy, level, args.equivalence_steps, mask=False
            ),
        }
        _print("decode_mask_one_length", results["decode_mask_one_length"])
    for name in ("bf16_compute", "packed_weights"):
        if name in only and not applies[name]:
            results[name] = {"applies": False, "phase": "generation"}
            print(f"{name}: does not apply here (compute dtype float32 or no oneDNN packing)")

    # Training: forward and backward of the default step (4 prompts x 8 completions).
    s = cfg.train
    if "chunked_head" in only or ("bf16_compute" in only and half):
        on = Trainer(policy, s, new, gen.temperature)
        off = {}
        if "chunked_head" in only:
            plain = s.model_copy(update={"chunked_head": False})
            off["chunked_head"] = Trainer(policy, plain, new, gen.temperature)
        arms = {"default": lambda: timed(lambda: grads(on, samples))}
        for name, trainer in off.items():
            arms[name] = lambda t=trainer: timed(lambda: grads(t, samples))
        if "bf16_compute" in only and half:

            def float32_step() -> dict:
                with in_float32(policy):
                    return timed(lambda: grads(on, samples))

            arms["bf16_compute"] = float32_step
        times = alternate(arms, args.repeats)
        reference = grads(on, samples)
        for name in list(arms)[1:]:
            key = "bf16_compute_training" if name == "bf16_compute" else name
            if name == "bf16_compute":
                with in_float32(policy):
                    other = grads(on, samples)
            else:
                other = grads(off[name], samples)
            results[key] = {
                "phase": "training",
                "measure": f"seconds of forward and backward over {len(samples)} sequences "
                f"(micro_batch_size {s.micro_batch_size})",
                **summary(times["default"], times[name]),
                "on": times["default"],
                "off": times[name],
                "memory_ratio": summary(times["default"], times[name], "peak_mib")["ratio"],
                "memory_spread": summary(times["default"], times[name], "peak_mib")["spread"],
                "faults_ratio": summary(times["default"], times[name], "faults")["ratio"],
                "equivalence": grad_equivalence(other, reference),
            }
            _print(key, results[key])
        del on, off

    if "unchecked_small" in only:
        small = samples[:16]  # two groups: one micro-batch of two rows
        sizes = [mb.input_ids.numel() for _, mb in Trainer(policy, s, new)._micro_batches(small)]
        ckpt = is_checkpointing(policy.model)
        with checkpointing(policy.model, True):
            skip = Trainer(
                policy, s.model_copy(update={"checkpoint_above_tokens": max(sizes)}), new
            )
            always = Trainer(policy, s.model_copy(update={"checkpoint_above_tokens": 0}), new)
            times = alternate(
                {
                    "default": lambda: timed(lambda: grads(skip, small)),
                    "off": lambda: timed(lambda: grads(always, small)),
                },
                args.repeats,
            )
            equivalence = grad_equivalence(grads(always, small), grads(skip, small))
        results["unchecked_small"] = {
            "phase": "training",
            "measure": f"seconds of forward and backward over {len(small)} sequences, one "
            f"micro-batch of {max(sizes)} tokens (the default threshold "
            f"{s.unchecked_tokens(policy.is_lora)}; the model loaded checkpointing: {ckpt})",
            **summary(times["default"], times["off"]),
            "on": times["default"],
            "off": times["off"],
            "memory_ratio": summary(times["default"], times["off"], "peak_mib")["ratio"],
            "equivalence": equivalence,
        }
        _print("unchecked_small", results["unchecked_small"])

    if "compact_adam" in only:
        params = [p for p in policy.model.parameters() if p.requires_grad]
        masters = [p.detach().clone() for p in params]
        g = torch.Generator().manual_seed(0)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g) * 1e-3
        kw = {"lr": s.lr, "betas": s.betas, "weight_decay": s.weight_decay}
        compact = CompactAdam(params, decoupled=True, **kw)
        fused = torch.optim.AdamW(params, fused=True, **kw)
        updated = {}
        for name, opt in (("default", compact), ("off", fused)):  # first steps: equivalence
            opt.step()
            updated[name] = torch.cat(
                [(p.detach() - m).flatten() for p, m in zip(params, masters, strict=True)]
            )
            for p, m in zip(params, masters, strict=True):
                p.data.copy_(m)
        diff, scale = relative_diff(updated["default"], updated["off"])
        del updated

        def step(opt) -> dict:
            out = timed(opt.step)
            for p, m in zip(params, masters, strict=True):
                p.data.copy_(m)
            return out

        times = alternate(
            {"default": lambda: step(compact), "off": lambda: step(fused)}, args.repeats
        )
        state = {name: _state_mib(opt) for name, opt in (("on", compact), ("off", fused))}
        for p in params:
            p.grad = None
        del masters, compact, fused
        results["compact_adam"] = {
            "phase": "optimiser step",
            "measure": "seconds of one optimiser step (its point is memory: state_mib)",
            **summary(times["default"], times["off"]),
            "on": times["default"],
            "off": times["off"],
            "state_mib": state,
            "memory_ratio": state["off"] / state["on"],
            "equivalence": {
                "kind": "weights after one step from the same gradients, against the update",
                "max_abs_diff": diff,
                "largest": scale,
                "relative": diff / scale if scale else 0.0,
            },
        }
        _print("compact_adam", results["compact_adam"])

    for name, res in results.items():
        eq = res.get("equivalence")
        if eq is not None:
            eq["tolerance"] = TOLERANCE[base_name(name)]
            eq["ok"] = eq["relative"] <= eq["tolerance"]
    return {
        "machine": _machine(policy),
        "model": args.model,
        "repeats": args.repeats,
        "new_tokens": new,
        "paths": results,
    }


def _packs(policy) -> bool:
    from sapo_node.train.policy import packs_linear_weights

    return policy.device.type == "cpu" and packs_linear_weights(policy.dtype)


def _state_mib(opt: torch.optim.Optimizer) -> float:
    seen: set[int] = set()
    total = 0
    tensors = [t for st in opt.state.values() for t in st.values() if torch.is_tensor(t)]
    tensors += [t for t in vars(opt).values() if torch.is_tensor(t)]
    tensors += [
        t
        for v in vars(opt).values()
        if isinstance(v, list | tuple)
        for t in v
        if torch.is_tensor(t)
    ]
    for t in tensors:
        if id(t) not in seen and t.numel() > 1:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total / 2**20


def _machine(policy) -> dict:
    model = ""
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            if key.strip() in ("flags", "Features") and not flags:
                flags = set(value.split())
    return {
        "cpu": model or platform.processor(),
        "cores": os.cpu_count(),
        "bf16_instructions": bool(flags & {"avx512_bf16", "amx_bf16", "bf16"}),
        "avx512": "avx512f" in flags,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "compute_dtype": str(policy.dtype).removeprefix("torch."),
    }


def _print(name: str, res: dict) -> None:
    lo, hi = res["spread"]
    line = f"{name}: {res['phase']}, {res['measure']}: plain/path {res['ratio']:.2f}x"
    line += f" ({lo:.2f}-{hi:.2f})"
    on = statistics.median(r["s"] for r in res["on"])
    off = statistics.median(r["s"] for r in res["off"])
    line += f"; median {on:.2f} s with it, {off:.2f} s without"
    if "tok_s" in res["on"][0]:
        ton = statistics.median(r["tok_s"] for r in res["on"])
        toff = statistics.median(r["tok_s"] for r in res["off"])
        line += f" ({ton:.1f} against {toff:.1f} tok/s)"
    if "state_mib" in res:
        line += f"; state {res['state_mib']['on']:.0f} against {res['state_mib']['off']:.0f} MiB"
    elif "peak_mib" in res["on"][0]:
        pon = statistics.median(r["peak_mib"] for r in res["on"])
        poff = statistics.median(r["peak_mib"] for r in res["off"])
        fon = statistics.median(r["faults"] for r in res["on"])
        foff = statistics.median(r["faults"] for r in res["off"])
        line += (
            f"; peak above start {pon:.0f} against {poff:.0f} MiB, minor faults "
            f"{fon / 1e3:.0f}k against {foff / 1e3:.0f}k"
        )
    eq = res["equivalence"]
    line += f"; equivalence ({eq['kind']}): max abs diff {eq['max_abs_diff']:.3g}"
    line += f" of {eq['largest']:.3g}"
    if "tokens_identical" in eq:
        line += f", tokens identical in {eq['rows_identical']} rows"
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="embedded", help="Another model directory (the tests' tiny model)."
    )
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "sapo-bench")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, help="torch threads (1 where another job holds a core)"
    )
    parser.add_argument("--new-tokens", type=int, help="Tokens generated a row (the config's: 64).")
    parser.add_argument("--equivalence-steps", type=int, default=8, help="Greedy tokens compared.")
    parser.add_argument("--only", help="Comma-separated paths: " + ", ".join(PATHS))
    parser.add_argument("--json", type=Path, help="Write the figures here.")
    args = parser.parse_args()

    from sapo_node.logs import configure_logging

    configure_logging()
    if args.threads:
        torch.set_num_threads(args.threads)
    report = measure(args)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
