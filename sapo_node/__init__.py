"""sapo-node: a SAPO swarm node."""

__version__ = "0.2.0"
