exec(open("/tmp/w/gen_ab_probe.py").read().split("tot = {")[0])
from sapo_node import decode as new_mod
same = [prompts[0]] * 4  # four prompts of one length: no padding anywhere
tot = {"old": 0.0, "new": 0.0}
for rep in range(4):
    for name, mod in (("old", old), ("new", new_mod)) if rep % 2 == 0 else (("new", new_mod), ("old", old)):
        pol_mod.decode = mod
        torch.manual_seed(rep)
        with torch.inference_mode(), policy.compute_weights():
            t = time.perf_counter()
            mod.sample(policy.model, same, 8, max_new_tokens=32, sampling=mod.Sampling(), eos_ids=[-5], device=policy.device, max_batch_sequences=64, autocast=policy.autocast)
            dt = time.perf_counter() - t
        tot[name] += dt; print(name, f"{dt:.2f} s", flush=True)
print(f"old/new seconds: {tot['old']/tot['new']:.2f}x")
