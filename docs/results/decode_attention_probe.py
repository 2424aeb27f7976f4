"""A decode step's attention, one layer, batch 32 (4 prompts x 8), 9 query heads on 3
key/value heads, head dim 64, L cached positions, a boolean mask: torch's SDPA on the
query packed as transformers 5.24 does for one query token (``pack_gqa``: [B, 3, 3, 64]
against the unrepeated cache) against a grouped matmul / softmax / matmul written out.

.venv/bin/python docs/results/decode_attention_probe.py   (2 threads)

2026-12-02, Intel Xeon avx512_bf16, ms per layer (best of two runs of 200 calls):
  float32  L=110: sdpa 0.216, grouped 0.249   L=140: 0.265, 0.288   L=170: 0.315, 0.353
  bfloat16 L=110: sdpa 0.177, grouped 0.219   L=140: 0.223, 0.243   L=170: 0.256, 0.297
SDPA as the model calls it is already the faster; the written-out version would not pay.
(With the cache repeated to 9 heads, as ``repeat_kv`` does, SDPA took 3.9-5.6 ms a layer
in float32 here: transformers' packing is what keeps it fast.)
"""

import time, torch
import torch.nn.functional as F
torch.set_num_threads(2)
B, H, KVH, d = 32, 9, 3, 64
G = H // KVH
def repeat_kv(x, n):
    b, h, l, dd = x.shape
    return x[:, :, None].expand(b, h, n, l, dd).reshape(b, h * n, l, dd)
def sdpa(q, k, v, mask):
    return F.scaled_dot_product_attention(q.reshape(B, KVH, G, d), k, v, attn_mask=mask, scale=d**-0.5).reshape(B, H, 1, d)
def grouped(q, k, v, mask):
    qg = q.view(B, KVH, G, d)
    s = torch.matmul(qg, k.transpose(-1, -2)) * d**-0.5
    s = s.masked_fill(~mask.view(B, 1, 1, -1), float("-inf"))
    p = torch.softmax(s, -1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, v).view(B, H, 1, d)
for dtype in (torch.float32, torch.bfloat16):
    for L in (110, 140, 170):
        q = torch.randn(B, H, 1, d, dtype=dtype); k = torch.randn(B, KVH, L, d, dtype=dtype); v = torch.randn(B, KVH, L, d, dtype=dtype)
        mask = torch.ones(B, 1, 1, L, dtype=torch.bool); mask[:, :, :, :5] = False
        a = sdpa(q, k, v, mask); b = grouped(q, k, v, mask)
        err = (a - b).abs().max().item()
        res = {}
        with torch.inference_mode():
            for name, fn in (("sdpa", sdpa), ("grouped", grouped)) * 2:
                for _ in range(3): fn(q, k, v, mask)
                t = time.perf_counter()
                for _ in range(200): fn(q, k, v, mask)
                res[name] = min(res.get(name, 1e9), (time.perf_counter() - t) / 200 * 1e3)
        print(dtype, L, {k: round(x, 3) for k, x in res.items()}, "ms per layer; 30 layers:", {k: round(30 * x, 1) for k, x in res.items()}, "maxdiff", err)
