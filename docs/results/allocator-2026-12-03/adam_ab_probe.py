import time, torch, sys, importlib.util
sys.path.insert(0, "/work/main")
from sapo_node.node import _fix_mmap_threshold
_fix_mmap_threshold()
import sapo_node.optim as new
spec = importlib.util.spec_from_file_location("old", "/tmp/w/optim_old.py"); old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
torch.set_num_threads(2)
from transformers import AutoConfig, AutoModelForCausalLM
cfg = AutoConfig.from_pretrained("/tmp/bench/models/smollm2-135m-instruct")
model = AutoModelForCausalLM.from_config(cfg)
params = list(model.parameters())
for p in params: p.grad = torch.randn_like(p) * 1e-3
opts = {"old": old.CompactAdam(params, lr=1e-5), "new": new.CompactAdam(params, lr=1e-5)}
for o in opts.values(): o.step()
chunks = [int(a) for a in sys.argv[1:]] or [new.CHUNK]
tot = {}
for r in range(3):
    for name in ["old"] + [f"new{c}" for c in chunks]:
        if name.startswith("new"): new.CHUNK = int(name[3:]); o = opts["new"]
        else: o = opts["old"]
        t = time.perf_counter(); o.step(); dt = time.perf_counter() - t
        tot.setdefault(name, []).append(dt)
for k, v in tot.items(): print(k, " ".join(f"{x:.3f}" for x in v), "min", f"{min(v):.3f}")
