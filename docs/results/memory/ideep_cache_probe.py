"""bfloat16 matrix products of 399 shapes: resident memory after, with and without caps.

python ideep_cache_probe.py none|before|after   (LRU_CACHE_CAPACITY=16 set before or after
importing torch; ONEDNN_PRIMITIVE_CACHE_CAPACITY from the environment)

2026-12-02, Intel Xeon with avx512_bf16, one thread:
  neither cap                               222 -> 633 MiB
  LRU_CACHE_CAPACITY=16 only                222 -> 607 MiB
  ONEDNN_PRIMITIVE_CACHE_CAPACITY=16 only   222 -> 422 MiB
  both, LRU set before importing torch      222 -> 269 MiB
  both, LRU set after importing torch       222 -> 271 MiB  (read at first use)
"""

import os
import sys

mode = sys.argv[1]
if mode == "before":
    os.environ["LRU_CACHE_CAPACITY"] = "16"
import torch  # noqa: E402

if mode == "after":
    os.environ["LRU_CACHE_CAPACITY"] = "16"
torch.set_num_threads(1)
w = torch.randn(576, 1536, dtype=torch.bfloat16)


def rss() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20


r0 = rss()
for n in range(1, 400):
    x = torch.randn(n, 576, dtype=torch.bfloat16)
    y = x @ w
print(mode, f"{r0:.0f} -> {rss():.0f} MiB")
