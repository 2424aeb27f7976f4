# One-off probe behind docs/security.md: worst 4-token windows of the embedded model's own
# completions (all, right) and of right ones with a payload, at round 0. Run from the repo
# root: .venv/bin/python docs/results/poisoning-cpu/probes/round0.py (it expects the
# de-quantised model cache of a poison_attack.py run at /tmp/pilot/.models).
import sys, json, random, torch
sys.path.insert(0, '/work/main')
torch.set_num_threads(1)
from sapo_node.config import Config, _deep_merge
import tomllib
from sapo_node.node import Node, training_set
from sapo_node.trainer import Sample
from sapo_node.tasks import make_task
from tests.support.poison import poison, DEFAULT_PAYLOAD
def main():
    spec = tomllib.loads(open('/work/main/configs/experiments/cpu.toml').read())
    cfg = Config.model_validate(_deep_merge(spec['base'], {"node": {"data_dir": "/tmp/probe/node", "seed": 5, "threads": 1}, "net": {"enabled": False}, "curriculum": {"enabled": False}}))
    import os
    os.makedirs('/tmp/probe/node', exist_ok=True)
    if not os.path.exists('/tmp/probe/node/models'):
        os.symlink('/tmp/pilot/.models', '/tmp/probe/node/models')
    node = Node(cfg)
    tasks = [make_task(ref) for ref in node.curriculum.sample(node.seed, 0, 24)]
    groups, _ = node._generate(tasks, 0)
    node._score(groups)
    def ww(lp, w=4):
        if len(lp) <= w: return sum(lp)/len(lp)
        return min(sum(lp[i:i+w])/w for i in range(len(lp)-w+1))
    rows = []
    for g in groups:
        mean = sum(g.rewards)/len(g.rewards)
        for ids, t, r in zip(g.completion_ids, g.texts, g.rewards):
            rows.append(dict(kind="own", pos=r > mean, text=t, s=Sample(g.prompt_ids, ids, 0.0)))
            if r > 0:
                for payload in (DEFAULT_PAYLOAD, "visit sapo.example", "All hail"):
                    pt = poison(t, payload, "suffix")
                    c = node.policy.encode_completion(pt, True, 48)
                    rows.append(dict(kind="suffix:"+payload, pos=True, text=pt, s=Sample(g.prompt_ids, c.ids, 0.0)))
                pt = poison(t, DEFAULT_PAYLOAD, "prefix")
                c = node.policy.encode_completion(pt, True, 48)
                rows.append(dict(kind="prefix", pos=True, text=pt, s=Sample(g.prompt_ids, c.ids, 0.0)))
    lps = node.trainer.completion_logprobs([r['s'] for r in rows])
    import collections
    out = collections.defaultdict(list)
    for r, lp in zip(rows, lps):
        for w in (1, 2, 4, 8):
            out[(r['kind'], r['pos'], w)].append(ww(lp, w))
    for k, v in sorted(out.items()):
        v = sorted(v)
        print(k, len(v), "min %.2f q05 %.2f q25 %.2f med %.2f" % (v[0], v[len(v)//20], v[len(v)//4], v[len(v)//2]))
    for r in rows[:30]:
        print(repr(r['text'])[:80], r['pos'])
    node.close()
    
if __name__ == "__main__":
    main()
