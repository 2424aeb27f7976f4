"""sapo-node: a SAPO swarm node."""

__version__ = "0.1.0"
