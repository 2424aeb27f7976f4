"""What the scripts in scripts/ are built from, and what the tests use of them.

Each script is a command line (docs/benchmarks.md, docs/soak.md, docs/fuzzing.md name
them); the parts they share live here, one concern a module:

- ``procs``: starting a child process that dies with its parent, reading the JSON log
  lines a node writes;
- ``loopback``: a node's network settings on 127.0.0.1 (no mDNS), for in-process swarms of
  scripts and tests;
- ``measure``: percentiles, timing, resident size and CPU time;
- ``report``: a target's verdict and a report file;
- ``messages``: synthetic completions and the wire groups made of them.

The larger scripts keep their command line, their ``main`` and the steps it reads as in
their own file, and their bulkier parts in a module named after them here:
``soak_nodes``, ``soak_harder`` and ``soak_report`` (scripts/soak.py), ``swarm_load``
(the in-process swarm of scripts/bench_swarm.py and scripts/bench_scale.py),
``swarm_training`` (bench_swarm's training case), ``vectors_invalid``
(scripts/make_vectors.py), ``round_setup`` (the model and trainer of
scripts/bench_round.py and scripts/bench_paths.py).

Scripts put the repository on ``sys.path`` and import ``scripts.support.<module>``;
tests import it the same way (pytest runs from the repository root).
"""
