import time, torch
torch.manual_seed(0)
def bench(f, n=10):
    f(); f()
    t = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - t) / n
shapes = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
for dt in (torch.bfloat16, torch.float32):
    ws = [[torch.randn(o, i).to(dt) for o, i in shapes] for _ in range(30)]
    for hint in (32, 8):
        try:
            packed = [[torch.ops.mkldnn._reorder_linear_weight(w, hint) for w in l] for l in ws]
        except Exception as e:
            print(dt, "pack error", str(e)[:200]); break
        for rows in (32, 8, 1):
            xs = {i: torch.randn(rows, i).to(dt) for _, i in shapes}
            def plain():
                for l in ws:
                    for w in l: torch.nn.functional.linear(xs[w.shape[1]], w)
            def pk():
                for l, pl in zip(ws, packed):
                    for w, p in zip(l, pl): torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], p, None, "none", [], "")
            w, p, x = ws[0][4], packed[0][4], xs[576]
            d = (torch.nn.functional.linear(x, w).float() - torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "").float()).abs().max().item()
            a = bench(plain); b = bench(pk); a2 = bench(plain); b2 = bench(pk)
            print(f"{dt} hint {hint} rows {rows}: plain {(a+a2)*500:.1f} ms packed {(b+b2)*500:.1f} ms ({(a+a2)/(b+b2):.2f}x) diff {d:.2e}", flush=True)
