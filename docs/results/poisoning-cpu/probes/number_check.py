"""Option 2 of issue 35, measured on honest completions: a check that refuses a peer's
right completion whose free text (outside its answer) holds a number that is neither in
the question nor the verified answer. Reads the honest peers' groups left in each run's
pools, re-scores them with the task's own verifier, and counts what the check refuses.

    python numbers.py RUN_DIR...
"""
import re, sqlite3, sys
from pathlib import Path
from sapo_node import wire
from sapo_node.tasks import make_task, get_family
from sapo_node.defence import last_answer

NUM = re.compile(r"-?\d+(?:\.\d+)?")

def numbers(text):
    return {float(x) for x in NUM.findall(text)}

def free_text(c):
    span = last_answer(c)
    return c if span is None else c[: span[0]] + " " + c[span[1] + len("</answer>") :]

total = refused = loose = 0
seen = set()
for run in sys.argv[1:]:
    for pool in Path(run).glob("node-*/pool.sqlite3"):
        db = sqlite3.connect(f"file:{pool}?mode=ro", uri=True)
        for digest, author, msg in db.execute("select digest, author, message from groups"):
            if author == "attacker" or digest in seen:
                continue
            seen.add(digest)
            g = wire.decode(msg)
            if isinstance(g, wire.Rejection):
                continue
            task = make_task(g.ref)
            fam = get_family(g.ref.family)
            allowed = numbers(task.question) | numbers(str(task.answer))
            for c in g.completions:
                if fam.score(task, c) < 1.0:
                    continue
                total += 1
                extra = numbers(free_text(c)) - allowed
                if {abs(x) for x in extra} - {abs(x) for x in allowed}:
                    loose += 1
                if extra:
                    refused += 1
                    if refused <= 5:
                        print("refused:", repr(c[:120]), "| question:", repr(task.question[:80]), "| extra:", sorted(extra))
print(f"honest right completions: {total}, refused by the number check: {refused} ({refused / max(total, 1):.1%}), signs aside: {loose} ({loose / max(total, 1):.1%})")
