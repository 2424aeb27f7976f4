"""What a peer's completion is made of, token by token: the text before its last answer,
the answer's tags, the answer itself, text after it, and the end of turn. Step 0 of
issue 45: which of these tokens `train.external_use` and `defence.answer_only` teach.

    python scripts/peer_tokens.py OUT/2-2-tasks --tokenizer OUT/.models/smollm2-135m-instruct \
        --sample docs/results/screening-cpu/peer-completions.jsonl

Reads the peers' groups waiting in every node's pool.sqlite3 under the directory (each
completion as the wire carried it, with this node's rewards), counts tokens with the
model's tokenizer.json, prints one JSON object (shares of tokens per part, over all
completions and over the right ones; lengths), and with --sample writes every completion
it read as JSON lines (author, task, text, reward): the data behind the figures.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sapo_node.intake import wire  # noqa: E402
from sapo_node.tasks import last_answer  # noqa: E402

PARTS = ("before", "tags", "answer", "after", "end")


def parts(text: str) -> dict[str, str]:
    """The text's parts around its last ``<answer>...</answer>`` (all "before" if none).

    >>> parts("so 7 <answer>7</answer> ok")
    {'before': 'so 7 ', 'tags': '<answer></answer>', 'answer': '7', 'after': ' ok'}
    """
    found = last_answer(text)
    if found is None:
        return {"before": text, "tags": "", "answer": "", "after": ""}
    start, close = found
    return {
        "before": text[:start],
        "tags": "<answer></answer>",
        "answer": text[start + len("<answer>") : close],
        "after": text[close + len("</answer>") :],
    }


def read_pools(run: Path) -> list[dict]:
    rows = []
    for db in sorted(run.glob("node-*/pool.sqlite3")):
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            for author, rewards, message in con.execute(
                "SELECT author, rewards, message FROM groups ORDER BY key"
            ):
                group = wire.decode(message)
                if isinstance(group, wire.Rejection):
                    continue
                for i, (text, reward) in enumerate(
                    zip(group.completions, json.loads(rewards), strict=True)
                ):
                    rows.append(
                        {
                            "pool": db.parent.name,
                            "author": author,
                            "task": group.question,
                            "text": text,
                            "finished": i not in group.unfinished,
                            "reward": reward,
                        }
                    )
        finally:
            con.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="an experiment configuration's directory")
    ap.add_argument("--tokenizer", type=Path, required=True, help="a dir with tokenizer.json")
    ap.add_argument("--sample", type=Path, help="write the completions read as JSON lines")
    args = ap.parse_args()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(args.tokenizer / "tokenizer.json"))
    rows = read_pools(args.run)
    if not rows:
        sys.exit(f"no pooled groups under {args.run}")

    def count(subset: list[dict]) -> dict:
        totals = dict.fromkeys(PARTS, 0)
        lengths = []
        for r in subset:
            n = 0
            for name, text in parts(r["text"]).items():
                k = len(tok.encode(text, add_special_tokens=False).ids) if text else 0
                totals[name] += k
                n += k
            totals["end"] += int(r["finished"])
            lengths.append(n + int(r["finished"]))
        all_tokens = sum(totals.values())
        lengths.sort()
        return {
            "completions": len(subset),
            "tokens": all_tokens,
            "share": {k: round(v / all_tokens, 4) for k, v in totals.items()},
            "tokens_mean": round(all_tokens / len(subset), 2),
            "tokens_median": lengths[len(lengths) // 2],
            "with_answer": round(
                sum(bool(parts(r["text"])["tags"]) for r in subset) / len(subset), 4
            ),
        }

    right = [r for r in rows if r["reward"] >= 1.0]
    out = {"all": count(rows), "right": count(right) if right else None}
    print(json.dumps(out, indent=2))
    if args.sample:
        args.sample.parent.mkdir(parents=True, exist_ok=True)
        args.sample.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


if __name__ == "__main__":
    main()
