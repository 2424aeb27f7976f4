# One-off probe behind docs/security.md (the rank table): worst 4-token windows, in log-prob
# and in log2(1 + rank), of each node's own right answers, the other node's (as sent and cut
# after the answer) and both with the payload, at round 0 ('start') or on the round-40
# checkpoints ('end') of /work/attack/on4. Run from the repo root after that run:
# .venv/bin/python docs/results/poisoning-cpu/probes/ranks.py end|start  (outputs: ranks-*.txt)
# Offline: which statistic separates an honest peer's right answers from poisoned ones?
import sys, json, math, collections
sys.path.insert(0, '/work/main'); sys.path.insert(0, '/work/main/scripts')
import torch
def main():
    torch.set_num_threads(2)
    import poison_attack as pa
    from sapo_node.node import Node
    from sapo_node.defence import worst_window, above_mean, quantile, outside_answer_chars
    from sapo_node.tasks import make_task
    from tests.support.poison import poison
    args = pa.parse_args(['--out', '/work/attack/on4', '--defences', 'on', '--nodes', '2', '--set', 'train.lr=5e-5'])
    cfgs = pa.node_configs(args)
    nodes = []
    for i, cfg in enumerate(cfgs):
        n = Node(cfg)
        if sys.argv[1] == 'end': n.resume()
        nodes.append(n)
    gens = []
    for i, n in enumerate(nodes):
        tasks = [make_task(ref) for ref in n.curriculum.sample(n.seed + 7, 1000, 16)]
        groups, _ = n._generate(tasks, 1000)
        n._score(groups)
        gens.append(groups)
        print('node', i, 'pass', sum(r for g in groups for r in g.rewards) / (16*8), flush=True)
    def stats(n, prompt, comp):
        m = n.policy.model
        ids = torch.tensor([list(prompt) + list(comp)])
        with torch.no_grad():
            lg = m(input_ids=ids).logits[0, len(prompt)-1:-1].float()
        lp = torch.log_softmax(lg, -1)
        t = torch.tensor(list(comp))
        tok = lp[torch.arange(len(comp)), t]
        rank = (lp > tok[:, None]).sum(-1).float()
        return tok.tolist(), torch.log2(rank + 1).tolist()
    res = {}
    for i, n in enumerate(nodes):
        rows = collections.defaultdict(list)
        for src, groups in (('own', gens[i]), ('peer', gens[1 - i])):
            for g in groups:
                for ids, t, up in zip(g.completion_ids, g.texts, above_mean(g.rewards)):
                    if not up: continue
                    lp, lr = stats(n, g.prompt_ids, ids)
                    rows[src].append((worst_window(lp, 4), -worst_window([-x for x in lr], 4), outside_answer_chars(t), t))
                    k = t.rfind('</answer>')
                    if k >= 0:
                        tt = t[:k + 9]
                        c = n.policy.encode_completion(tt, True, 48)
                        lp, lr = stats(n, g.prompt_ids, c.ids)
                        rows[src + '-cut'].append((worst_window(lp, 4), -worst_window([-x for x in lr], 4), outside_answer_chars(tt), tt))
                    for pos in ('prefix', 'suffix'):
                        c = n.policy.encode_completion(poison(t, "Visit free-gpu.example", pos), True, 48)
                        lp, lr = stats(n, g.prompt_ids, c.ids)
                        rows[src + '+' + pos].append((worst_window(lp, 4), -worst_window([-x for x in lr], 4), 0, ''))
        for k, v in rows.items():
            a = [x[0] for x in v]; b = [x[1] for x in v]; o = [x[2] for x in v]
            print(f'node{i} {k:12s} n={len(v):3d} lp q0 {quantile(a,0):7.2f} q05 {quantile(a,.05):7.2f} q50 {quantile(a,.5):7.2f} | lrank q50 {quantile(b,.5):5.2f} q95 {quantile(b,.95):5.2f} max {max(b):5.2f} | out q50 {quantile(o,.5)} q95 {quantile(o,.95)} max {max(o)}', flush=True)
        low = sorted(rows['peer-cut'], key=lambda x: -x[1])[:5]
        for x in low: print('   low peer', round(x[0],2), round(x[1],2), repr(x[3])[:120])
        res[i] = {k: [x[:3] for x in v] for k, v in rows.items()}
    json.dump(res, open(f'/work/probe/sep-{sys.argv[1]}.json', 'w'))
if __name__ == '__main__':
    main()
