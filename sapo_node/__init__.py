"""sapo-node: a SAPO swarm node."""

import os

__version__ = "0.3.0"

# oneDNN, which runs torch's bfloat16 matrix products on CPUs, keeps a compiled primitive
# per shape, up to 1024 by default, and ideep (torch's layer over it) keeps its own
# computation per shape, also up to 1024 (LRU_CACHE_CAPACITY). A node's shapes change
# every round (lengths, rows dropped at EOS), so its memory rose round after round. 16 of
# each keep a step's shapes (docs/benchmarks.md: oneDNN's cap, 200 MiB less by round 25;
# ideep's, training steps of changing shapes flat from the seventh where they rose 8 MiB
# a step; neither slower). Set here, before torch is imported, so that they hold wherever
# they are read; the environment's own values win.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")
os.environ.setdefault("LRU_CACHE_CAPACITY", "16")
