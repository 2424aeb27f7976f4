#!/bin/sh
# The GPU experiment of issue 45 in one command, for a lent CUDA machine with a time limit:
#   scripts/gpu_experiment.sh OUT [SECONDS [EXPERIMENT OPTIONS...]]
# Runs configs/experiments/sharing-gpu.toml (or $SPEC) until done or SECONDS (default
# 540) pass, then writes the report of what finished; a later call resumes from OUT.
set -eu
OUT="${1:?usage: scripts/gpu_experiment.sh OUT [SECONDS [OPTIONS...]]}"
LIMIT="${2:-540}"
shift $(( $# < 2 ? $# : 2 ))
SPEC="${SPEC:-configs/experiments/sharing-gpu.toml}"
PY="${PYTHON:-.venv/bin/python}"
if [ -z "${ALLOW_CPU:-}" ]; then
    "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"
fi
# SIGINT at the limit: the runner stops after the round in progress and keeps its state
timeout -s INT -k 60 "$LIMIT" "$PY" -m sapo_node.cli experiment "$SPEC" --out "$OUT" "$@" || true
"$PY" -m sapo_node.cli experiment "$SPEC" --out "$OUT" --report-only
