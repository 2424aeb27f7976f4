"""What a peer's group goes through: the wire format, the checks, the pool, the
poisoning defences, what this node keeps about its peers, and how many groups it takes."""
