import time, torch, torch.nn.functional as F
torch.manual_seed(0)
def bench(f, n=200):
    for _ in range(5): f()
    t = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - t) / n
dt = torch.bfloat16
for rows in (8, 32):
    kv = 150
    q = torch.randn(rows, 9, 1, 64).to(dt)
    kbuf = torch.randn(rows, 3, 170, 64).to(dt); vbuf = torch.randn(rows, 3, 170, 64).to(dt)
    k, v = kbuf[:, :, :kv], vbuf[:, :, :kv]
    boolmask = torch.ones(rows, 1, 1, kv, dtype=torch.bool); boolmask[:, :, :, :5] = False
    fmask = torch.zeros(rows, 1, 1, kv, dtype=dt).masked_fill(~boolmask, float("-inf"))
    def sdpa_bool(): return F.scaled_dot_product_attention(q, k, v, attn_mask=boolmask, enable_gqa=True)
    def sdpa_f(): return F.scaled_dot_product_attention(q, k, v, attn_mask=fmask, enable_gqa=True)
    def sdpa_nomask(): return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    def manual():
        qg = q.view(rows, 3, 3, 64)  # [B, kvh, groups, d]
        s = torch.matmul(qg, k.transpose(-1, -2)) * 0.125  # [B,3,3,kv]
        s = s + fmask.view(rows, 1, 1, kv)
        p = torch.softmax(s.float(), -1).to(dt)
        return torch.matmul(p, v).view(rows, 9, 1, 64)
    ref = sdpa_bool().float()
    print("manual diff", (manual().float() - ref).abs().max().item(), "fmask diff", (sdpa_f().float() - ref).abs().max().item())
    for name, f in (("sdpa bool", sdpa_bool), ("sdpa float", sdpa_f), ("sdpa nomask", sdpa_nomask), ("manual", manual), ("sdpa bool", sdpa_bool), ("manual", manual)):
        print(f"rows {rows} {name}: {bench(f)*1e6:.0f} us")
