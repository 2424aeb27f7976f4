"""What the scripts in scripts/ are built from, and what the tests use of them.

Each script is a command line (docs/benchmarks.md, docs/soak.md, docs/fuzzing.md name
them); the parts more than one of them uses live here, one concern a module:

- ``procs``: starting a child that dies with the script, signalling its process group,
  reading the JSON log lines a node writes, standard error into a log file;
- ``loopback``: a node's network settings on 127.0.0.1 (no mDNS), for the in-process
  swarms of the benchmarks and of the transport tests (tests/support/transports.py);
- ``measure``: percentiles, rates, timing, resident size, glibc's heap, CPU seconds;
- ``report``: a target's verdict and a report file;
- ``messages``: synthetic completions and the valid wire groups made of them;
- ``swarm_load``: the in-process swarm and its ledger (scripts/bench_swarm.py,
  scripts/bench_scale.py);
- ``round_setup``: the default config's model, prompts and training round, and the
  switches the benchmarks turn (scripts/bench_round.py, scripts/bench_paths.py).

A larger script keeps its command line, its ``main`` and the steps it reads in order in
its own file; its bulkier parts are here, named after it: ``soak_nodes``,
``soak_harder`` and ``soak_report`` (scripts/soak.py), ``swarm_training``
(scripts/bench_swarm.py's training case), ``vectors`` (scripts/make_vectors.py),
``round_memory`` (scripts/bench_round.py's memory modes), ``paths_equivalence``
(scripts/bench_paths.py's checks that a path computes the same).

Scripts put the repository on ``sys.path`` and import ``scripts.support.<module>``;
tests import it the same way (pytest runs from the repository root).
"""
