"""How much of honest peers' completions the defence still teaches, in balance.

Since ``defence.context_rank``, a peer's right completion teaches only if every token of
its text before the answer is among this node's first choices there (ranks 0 to the
bound), and its group's wrong ones only as far as its right ones teach (``balance``).
Honest peers write some reasoning before the answer, in which this node would have
chosen another token now and then: this measures what the rule costs them.

It screens the groups with signal of real, honest peers (the screening run's peer
completions, docs/results/screening-cpu/peer-completions.jsonl, from 4 nodes of the
embedded model) with the default defence and this node's ranks (the default config's
policy on ``--model``, untrained), once as the defaults are and once with no bound on
the context (every context in bound: the rule before), and prints one JSON object: the
tokens taught of the kept completions under each, and of them the format's (the
answer's tags and end of turn), the ratios, and the share of above-mean completions
whose text before the answer is in bound.

Usage: python scripts/peer_taught.py [--model embedded|DIR] [--groups N] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sapo_node.config import Config  # noqa: E402
from sapo_node.intake.defence import (  # noqa: E402
    Defence,
    above_mean,
    answer_tokens,
    format_tokens,
    in_context,
)
from sapo_node.samples import Sample  # noqa: E402
from scripts.support.sample_setup import SAMPLE, trainer_and_groups  # noqa: E402

UNBOUNDED = 10**6  # every context in bound: what a peer's group taught before the rule


def taught(defence: Defence, groups: list, spans) -> dict[str, int]:
    """Tokens taught, and of them the format's, over the completions ``defence`` keeps."""
    kept, _ = defence.screen([], groups)
    out = {"taught": 0, "format_tokens": 0, "format_taught": 0}
    for g in kept:
        for ids, flags in zip(g.completion_ids, g.taught, strict=True):
            found = spans(ids)
            fmt = format_tokens(found[0], found[1], len(ids)) if found else set()
            out["taught"] += sum(flags)
            out["format_tokens"] += len(fmt)
            out["format_taught"] += sum(flags[k] for k in fmt)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded", help="embedded, or a model directory")
    ap.add_argument("--sample", type=Path, default=SAMPLE)
    ap.add_argument("--groups", type=int, default=0, help="the first N groups (0: all)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    settings = Config().defence
    with tempfile.TemporaryDirectory() as cache:
        trainer, groups = trainer_and_groups(args, Path(cache))
        groups = [replace(g, origin="peer") for g in groups[: args.groups or None]]
        spans = trainer.policy.token_spans
        out = {"model": args.model, "groups": len(groups)}
        for name, bound in (("default", settings.context_rank), ("before", UNBOUNDED)):
            d = Defence(
                settings.model_copy(update={"context_rank": bound}),
                trainer.completion_ranks,
                lambda *_: None,
                spans=spans,
            )
            out[name] = taught(d, groups, spans)
        now, before = out["default"], out["before"]
        out["taught_over_before"] = round(now["taught"] / before["taught"], 4)
        out["format_over_before"] = round(now["format_taught"] / before["format_taught"], 4)
        out["above_mean_in_bound"] = in_bound_share(trainer, groups, settings)
    print(json.dumps(out))


def in_bound_share(trainer, groups: list, settings) -> float:
    """The share of the groups' above-mean completions whose text before the answer is in
    ``settings.context_rank`` (``in_context``, with this node's ranks)."""
    todo = [(g, i) for g in groups for i, up in enumerate(above_mean(g.rewards)) if up]
    ranks = trainer.completion_ranks(
        [Sample(g.prompt_ids, g.completion_ids[i], 0.0) for g, i in todo]
    )
    ok = n = 0
    for (g, i), r in zip(todo, ranks, strict=True):
        found = trainer.policy.token_spans(g.completion_ids[i])
        if not found:
            continue
        n += 1
        answer = answer_tokens(found[0], found[1], len(r))
        ok += in_context(answer, r, settings.context_rank)
    return round(ok / n, 4) if n else float("nan")


if __name__ == "__main__":
    main()
