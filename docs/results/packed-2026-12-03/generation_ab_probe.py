"""Generation with the previous decode.py (old) against the working tree's (new), alternated, same prompts/seeds."""
import argparse, importlib.util, pickle, sys, time
from pathlib import Path
sys.path.insert(0, "/work/main/scripts"); sys.path.insert(0, "/work/main")
import torch, bench_round as br
import sapo_node.policy as pol_mod
from sapo_node import decode as new
from sapo_node.node import _fix_mmap_threshold
_fix_mmap_threshold()
spec = importlib.util.spec_from_file_location("old_decode", "/tmp/w/old_decode.py")
old = importlib.util.module_from_spec(spec); sys.modules["old_decode"] = old; spec.loader.exec_module(old)
args = argparse.Namespace(data_dir=Path("/tmp/bench"), model="embedded", threads=None, lora=False)
cfg, policy, _ = br._default_prompts(args)
prompts = pickle.load(open("/tmp/w/prompts.pkl", "rb"))
real_pack = pol_mod._pack
tot = {"old": [0, 0], "new": [0, 0]}
for rep in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    for name, mod in (("old", old), ("new", new)) if rep % 2 == 0 else (("new", new), ("old", old)):
        pol_mod.decode = mod
        pol_mod._pack = real_pack if name == "new" else (lambda linears, dtype: None)
        torch.manual_seed(rep)
        t = time.perf_counter(); out = policy.generate(prompts, cfg.generation, n=8); dt = time.perf_counter() - t
        tot[name][0] += dt; tot[name][1] += out.new_tokens
        print(f"{name}: {dt:.2f} s, {out.new_tokens} tokens, {out.new_tokens/dt:.0f} tok/s", flush=True)
for k, (s, n) in tot.items(): print(f"{k}: {n/s:.1f} tok/s overall")
print(f"new/old tok/s: {(tot['new'][1]/tot['new'][0])/(tot['old'][1]/tot['old'][0]):.2f}x")
