# One-off probe behind docs/security.md: the same windows on the round-40 checkpoints of
# /work/attack/on (own completions, own right ones, poisoned right ones). Run from the repo
# root after that run: .venv/bin/python docs/results/poisoning-cpu/probes/checkpoints.py
import sys, json, random, sqlite3
sys.path.insert(0, '/work/main')
def main():
    import argparse
    from pathlib import Path
    sys.argv = ['x', '--out', '/work/attack/on', '--defences', 'on', '--nodes', '2', '--set', 'train.lr=5e-5']
    sys.path.insert(0, '/work/main/scripts')
    import poison_attack as pa
    args = pa.parse_args(sys.argv[1:])
    configs = pa.node_configs(args)
    from sapo_node.node import Node
    from sapo_node.pool import PooledGroup
    from sapo_node import wire
    from sapo_node.defence import worst_window, above_mean, quantile
    from sapo_node.trainer import Sample
    from sapo_node.tasks import make_task
    from tests.support.poison import poison
    for i, cfg in enumerate(configs):
        node = Node(cfg)
        node.resume()
        tasks = [make_task(ref) for ref in node.curriculum.sample(node.seed, 1000, 16)]
        groups, _ = node._generate(tasks, 1000)
        node._score(groups)
        other = f"node-{1 - i}"
        db = sqlite3.connect(str(cfg.node.resolved_data_dir() / 'pool.sqlite3'))
        peer = []
        for (m, rw, a, rec) in db.execute("select message, rewards, author, received from groups"):
            if a != other: continue
            peer.append(node._as_group(PooledGroup(wire.decode(m), a, tuple(json.loads(rw)), rec)))
        rows = []
        for g in groups:
            for ids, t, up in zip(g.completion_ids, g.texts, above_mean(g.rewards)):
                rows.append(('own_all', g.prompt_ids, ids))
                if up: rows.append(('own_pos', g.prompt_ids, ids))
                if up:
                    c = node.policy.encode_completion(poison(t, "Visit free-gpu.example", "prefix"), True, 48)
                    rows.append(('poison', g.prompt_ids, c.ids))
        for g in peer:
            for ids, t, up in zip(g.completion_ids, g.texts, above_mean(g.rewards)):
                if up: rows.append(('peer_pos', g.prompt_ids, ids))
                rows.append(('peer_all', g.prompt_ids, ids))
        lps = node.trainer.completion_logprobs([Sample(p, c, 0.0) for _, p, c in rows])
        out = {}
        for (k, _, _), lp in zip(rows, lps):
            out.setdefault(k, []).append(worst_window(lp, 4))
        print('node', i, 'pass', sum(r for g in groups for r in g.rewards) / 128)
        for k, v in sorted(out.items()):
            print(' ', k, len(v), ' '.join(f"{q}:{quantile(v, q):.2f}" for q in (0, 0.05, 0.25, 0.5)))
        ex = [t for g in peer for t, up in zip(g.texts, above_mean(g.rewards)) if up][:6]
        print('  peer pos examples', ex)
        ex = [t for g in groups for t, up in zip(g.texts, above_mean(g.rewards)) if up][:6]
        print('  own pos examples', ex)
        node.close()
if __name__ == '__main__':
    main()
