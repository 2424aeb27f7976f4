"""An experiment's final checkpoints evaluated again, on another held-out set.

A run's held-out set is fixed by its spec (``[eval]``: seed, tasks, samples). To measure
its end models on a larger set no run has seen, this evaluates each node's checkpoint of
the last round with the spec's node config and ``eval.seed`` / ``eval.tasks`` /
``eval.samples`` replaced, then compares configurations as the experiment's report does:
held-out greedy accuracy paired by node seed, exact sign-flip p, each replicate swarm's
mean difference.

    python scripts/heldout_recheck.py SPEC OUT --arm 4/0 --arm "2/2 ..." \
        --eval-seed 1 --tasks 1024 --samples 1 [--nodes 0-3] [--threads 1]
    python scripts/heldout_recheck.py SPEC OUT --compare "2/2 ..." 4/0 --eval-seed 1 --tasks 1024

Each node's result goes to OUT/<arm>/node-<i>/heldout-seed<S>-<tasks>.json (a node
already there is skipped, so runs resume and can be split by --nodes; one made with
other --samples is an error); ``--start`` evaluates the untrained model once, into
OUT/start-eval/. ``--compare`` reads them and prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sapo_node.atomic import write_text_atomic  # noqa: E402
from sapo_node.evaluate import evaluate_checkpoint  # noqa: E402
from sapo_node.experiment import _share_model_cache  # noqa: E402
from sapo_node.experiment.significance import sign_flip_p  # noqa: E402
from sapo_node.experiment.spec import (  # noqa: E402
    arm,
    arms,
    compared_nodes,
    compared_per_swarm,
    load_spec,
    node_config,
)


def result_path(out: Path, dirname: str, index: int, seed: int, tasks: int) -> Path:
    return out / dirname / f"node-{index}" / f"heldout-seed{seed}-{tasks}.json"


def done(path: Path, samples: int) -> bool:
    """Whether ``path`` holds this evaluation already (a different one there: an error)."""
    if not path.exists():
        return False
    there = _read(path)["eval/samples"]
    if there != samples:
        raise SystemExit(f"{path} was evaluated with --samples {there}: move it to use {samples}")
    return True


def evaluate_nodes(spec, out: Path, label: str, indices, seed: int, tasks: int) -> None:
    a = arm(spec, label)
    rounds = spec.experiment.rounds
    for i in indices:
        path = result_path(out, a.dirname, i, seed, tasks)
        if done(path, spec.eval.samples):
            continue
        config = node_config(spec, a, i, out)
        checkpoint = config.node.resolved_data_dir() / "checkpoints" / f"round-{rounds:06d}"
        if not checkpoint.is_dir():
            raise SystemExit(f"{checkpoint}: no checkpoint of round {rounds}")
        report, what = evaluate_checkpoint(config, checkpoint)
        _write(path, report, what)
        print(
            f"{label} node {i}: greedy {report.metrics()['eval/greedy']:.4f} "
            f"({report.seconds:.0f} s)",
            flush=True,
        )


def evaluate_start(spec, out: Path, seed: int, tasks: int) -> None:
    """The untrained model (every node's start: same weights, same eval RNG)."""
    path = out / "start-eval" / f"heldout-seed{seed}-{tasks}.json"
    if done(path, spec.eval.samples):
        return
    config = node_config(spec, arms(spec)[0], 0, out)
    empty = out / "start-eval" / "untrained"  # a data dir with no checkpoint
    empty.mkdir(parents=True, exist_ok=True)
    _share_model_cache(out, empty)  # the experiment's de-quantised copy, not another
    config = config.model_copy(update={"node": config.node.model_copy(update={"data_dir": empty})})
    report, what = evaluate_checkpoint(config)
    _write(path, report, what)
    print(f"start: greedy {report.metrics()['eval/greedy']:.4f} ({report.seconds:.0f} s)")


def _write(path: Path, report, what: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps({"evaluated": what, **report.metrics()}) + "\n")


def compare(spec, out: Path, treatment: str, baseline: str, seed: int, tasks: int) -> dict:
    per_swarm, n = compared_per_swarm(spec), compared_nodes(spec)  # a late joiner: 1 a swarm
    t, b = arm(spec, treatment), arm(spec, baseline)
    read = [[_read(result_path(out, a.dirname, i, seed, tasks)) for i in range(n)] for a in (t, b)]
    greedy = [[r["eval/greedy"] for r in rows] for rows in read]
    diffs = [x - y for x, y in zip(*greedy, strict=True)]
    families = sorted(k.split("/")[-1] for k in read[0][0] if k.startswith("eval/greedy/"))
    return {
        "held_out": {"seed": seed, "tasks": tasks, "samples": read[0][0]["eval/samples"]},
        "greedy_end": [round(sum(g) / n, 4) for g in greedy],
        "diff_points": round(100 * sum(diffs) / n, 2),
        "p": round(sign_flip_p(diffs), 4),
        "pairs_favouring_treatment": sum(d > 0 for d in diffs),
        "pairs_tied": sum(d == 0 for d in diffs),
        "replicate_diff_points": [
            round(100 * sum(diffs[k : k + per_swarm]) / per_swarm, 2)
            for k in range(0, n, per_swarm)
        ],
        "pass1_end": [round(sum(r["eval/pass1"] for r in rows) / n, 4) for rows in read],
        "greedy_by_family": {
            f: [round(sum(r[f"eval/greedy/{f}"] for r in rows) / n, 4) for rows in read]
            for f in families
        },
        "greedy_by_node": [[round(x, 4) for x in g] for g in greedy],
    }


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SystemExit(f"{path}: not evaluated yet (--arm with the same set first)") from None
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{path}: unreadable ({exc}); remove it and evaluate again") from None


def _indices(text: str | None, n: int) -> range:
    if text is None:
        return range(n)
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--arm", action="append", default=[], help="a configuration's label")
    parser.add_argument("--start", action="store_true", help="evaluate the untrained model")
    parser.add_argument("--compare", nargs=2, metavar=("TREATMENT", "BASELINE"))
    parser.add_argument("--eval-seed", type=int, required=True)
    parser.add_argument("--tasks", type=int, required=True)
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--nodes", help="node indices, e.g. 0-3 (default: all)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    eval_ = {"seed": args.eval_seed, "tasks": args.tasks, "samples": args.samples}
    spec = load_spec(args.spec, {"eval": eval_, "experiment": {"threads": args.threads}})
    n = compared_nodes(spec)
    if args.start:
        evaluate_start(spec, args.out, args.eval_seed, args.tasks)
    for label in args.arm:
        evaluate_nodes(spec, args.out, label, _indices(args.nodes, n), args.eval_seed, args.tasks)
    if args.compare:
        result = compare(spec, args.out, *args.compare, args.eval_seed, args.tasks)
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
