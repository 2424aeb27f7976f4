"""The paper's controlled experiment: does sharing help?

For each configuration of a grid of (I, J) with I + J fixed (and optionally other pool
sampling policies at one ratio), N nodes run through the real ``Node.run_round`` path
in one process, exchanging real wire bytes over the in-memory transport, in lockstep:
every node runs round r, then what they published in round r is delivered, then every
node runs round r + 1. So in every configuration node i has the same seed, the same
schedule and the same view of its peers (their previous round's groups). Each node is
evaluated on the held-out set (evaluate.py) before training, every ``eval.every``
rounds, and at the end. Curriculum off (fixed difficulty, as in the paper) unless
``experiment.curriculum``. With ``[experiment.late_joiner]`` the compared node of each
replicate is a fresh node that joins a swarm trained before it (or, with J = 0, runs
alone): the scenario of a user who joins a swarm that has run for days.

Departures from the paper, and why: 4 nodes and I + J = 4 by default (a CPU holds four
135M models; the paper had 8 GPUs and I + J = 8); held-out evaluation added, since
training reward alone is confounded by what a node chooses to generate.

Experiment file (TOML), every key optional but ``grid``::

    [experiment]
    nodes = 4                           # N nodes per swarm
    rounds = 40                         # rounds per node
    grid = ["4/0", "3/1", "2/2", "1/3"] # I/J, I + J the same; one must have J = 0
    sampling = ["uniform"]              # other pool.sampling policies, at ...
    sampling_ratio = "2/2"              # ... this I/J (the grid's use base pool.sampling)
    solver = []                         # accuracies: each adds a configuration at ...
    solver_ratio = "2/2"                # ... this I/J whose swarm has a solver member too
    solver_groups = 4                   # groups the solver member shares a round
    seed = 1000                         # node i of replicate k: seed + (k * N + i) * 2**40
    replicates = 1                      # independent swarms per configuration
    threads = 1                         # torch threads of the process (0: torch's default)
    checkpoint_every = 1                # 1: a stop loses no finished round
    window = 10                         # moving average of the reward curves
    curriculum = false                  # true: the base config's curriculum runs
    periodic_samples = 1                # samples per task of the evaluations in between
    thresholds = [0.3]                  # held-out greedy: compute until each (time to accuracy)
    confirmatory_runs_on_question = 6   # printed in the report, with question = "..."
    [experiment.late_joiner]            # each replicate's node joins a warm swarm of N
    swarm_rounds = 60                   # rounds the swarm trained first
    swarms = 1                          # warm swarms (joiner k joins k % swarms)
    swarm_from = ""                     # an earlier OUT/<configuration> to resume them from
    [eval]                              # the held-out evaluation: node [eval] fields
    tasks = 32
    samples = 4
    seed = 0
    every = 0                           # also every N rounds (start and end always)
    [base]                              # node config overrides, as in a node's TOML
    [base.generation]
    max_new_tokens = 48

Output under OUT::

    OUT/experiment.json                 the resolved experiment (a resume must match)
    OUT/<I-J[-sampling]>/node-<i>/      each node's data dir: metrics.jsonl, eval.jsonl,
                                        checkpoints/, pool.sqlite3
    OUT/start-eval/<key>.json           the untrained model's evaluation (run once per
                                        model and eval settings, reused by every node)
    OUT/swarm-<w>/node-<m>/             a late joiner's warm swarm w, and at-join.json
    OUT/<configuration>/swarm-<k>/      the copy of it that joiner k joined
    OUT/.models/                        the one de-quantised copy of the model
    OUT/results.json                    every figure of the report, per node too
    OUT/results.md                      the table, like the paper's, with its notes
    OUT/reward_curves.png               mean reward per round, moving average
    OUT/heldout.png                     held-out accuracy at each evaluation
    OUT/answer_format.png               share of own completions in the answer format
    OUT/time_to_accuracy.png            held-out greedy against compute (with thresholds)

Resuming: running the same command again continues each node from its checkpoint;
rounds in metrics.jsonl and evaluations in eval.jsonl up to the checkpoint are not
redone. A swarm whose nodes have every round's metrics and their final evaluation is
finished, with or without checkpoints (copied into a new OUT, it is not run again).
Configurations can run as separate processes (``--only 2/2``), e.g. two at
once with one thread each; the report covers every configuration found finished.

The package, each module importing only those before it: ``spec`` (the experiment file,
its configurations, each node's seed and config), ``significance`` (paired tests and
intervals), ``analysis`` (the pure analysis), ``report`` (the tables and plots, written
from OUT's files) and ``runner`` (the lockstep swarms, resume, ``run_experiment``).
"""

from sapo_node.experiment.analysis import (
    FORMAT_TARGET,
    FORMAT_WINDOW,
    OUTCOMES,
    analyse,
    format_summary,
    halves,
    heldout_summary,
    mechanism,
    mechanism_sums,
    node_summary,
)
from sapo_node.experiment.report import collect, plot_results, render_table, report
from sapo_node.experiment.runner import (
    PARKED,
    START_EVALS,
    Deferred,
    SolverMember,
    _locked,
    _share_model_cache,
    check_resumable,
    run_arm,
    run_experiment,
    start_eval_key,
)
from sapo_node.experiment.spec import (
    MEMBER_INDEX,
    SEED_SPACING,
    SOLVER_INDEX,
    Arm,
    EvalLog,
    ExperimentSection,
    ExperimentSpec,
    LateJoiner,
    arm,
    arms,
    eval_due,
    eval_samples,
    load_spec,
    node_config,
    node_seed,
    parse_ratio,
)

__all__ = [
    "FORMAT_TARGET",
    "FORMAT_WINDOW",
    "MEMBER_INDEX",
    "OUTCOMES",
    "PARKED",
    "SEED_SPACING",
    "SOLVER_INDEX",
    "START_EVALS",
    "Arm",
    "Deferred",
    "EvalLog",
    "ExperimentSection",
    "ExperimentSpec",
    "LateJoiner",
    "SolverMember",
    "_locked",
    "_share_model_cache",
    "analyse",
    "arm",
    "arms",
    "check_resumable",
    "collect",
    "eval_due",
    "eval_samples",
    "format_summary",
    "halves",
    "heldout_summary",
    "load_spec",
    "mechanism",
    "mechanism_sums",
    "node_config",
    "node_seed",
    "node_summary",
    "parse_ratio",
    "plot_results",
    "render_table",
    "report",
    "run_arm",
    "run_experiment",
    "start_eval_key",
]
