import time, torch, torch.nn.functional as F
def bench(f, n=300):
    for _ in range(5): f()
    t = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - t) / n
dt = torch.bfloat16
for B in (32, 8):
    cap = 170
    q = torch.randn(B, 3, 3, 64).to(dt)
    kb = torch.randn(B, 3, cap, 64).to(dt); vb = torch.randn(B, 3, cap, 64).to(dt)
    for L in (110, 140, 169):
        vis = torch.ones(B, 1, 1, cap, dtype=torch.bool); vis[:, :, :, L:] = False; vis[:B//2, :, :, :3] = False
        view = lambda: F.scaled_dot_product_attention(q, kb[:, :, :L], vb[:, :, :L], attn_mask=vis[..., :L])
        full = lambda: F.scaled_dot_product_attention(q, kb, vb, attn_mask=vis)
        print(B, L, f"view {bench(view)*1e6:.0f} us, full {bench(full)*1e6:.0f} us, view {bench(view)*1e6:.0f} us, full {bench(full)*1e6:.0f} us")
