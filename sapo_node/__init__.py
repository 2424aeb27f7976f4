"""sapo-node: a SAPO swarm node."""

__version__ = "0.4.0"

# Importing the package changes no process-wide setting: the programs that run nodes set
# the allocator's and oneDNN's (sapo_node.ops.lifecycle.cap_kernel_caches, fix_mmap_threshold)
# and log them.
