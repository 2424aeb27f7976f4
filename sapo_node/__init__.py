"""sapo-node: a SAPO swarm node."""

import os

__version__ = "0.2.0"

# oneDNN, which runs torch's bfloat16 matrix products on CPUs, keeps a compiled primitive
# per shape, up to 1024 by default; a node's shapes change every round (lengths, rows
# dropped at EOS), so its memory rose round after round. 16 keep a step's shapes
# (docs/benchmarks.md: the same 100 rounds, 200 MiB less by round 25, no slower). Set
# here, before torch is imported, so that it holds wherever oneDNN reads it; the
# environment's own value wins.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")
