"""Several command lines of one script in one Python process, one after another.

A script's tests run it as a command would, but a process's start-up (torch,
transformers) can cost more than a run on the tiny model: ``run_in_one_process`` runs
each command line with ``runpy`` as ``__main__`` (its own ``sys.argv``), in a fresh
process of its own shared by those runs only, and returns each one's exit status and
standard output. A run that fails leaves its traceback in its output and the next still
runs. What a run leaves in the process (imports, the allocator's settings) the next one
finds: give first a run whose figures need a fresh process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_DRIVER = """
import contextlib, json, runpy, sys, traceback
script, out, runs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
for i, argv in enumerate(runs):
    rc = 0
    with open(f"{out}/{i}.out", "w") as f, contextlib.redirect_stdout(f):
        sys.argv = [script, *argv]
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        except BaseException:
            traceback.print_exc(file=f)
            rc = 1
    open(f"{out}/{i}.rc", "w").write(str(rc))
"""


def run_in_one_process(
    script: Path, runs: list[list[str]], out: Path, cwd: Path, timeout: float
) -> tuple[list[tuple[int, str]], str]:
    """Each of ``runs`` (a command line's arguments) of ``script``, in turn, in one process;
    returns [(exit status, stdout)] a run, and the process's standard error."""
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(script), str(out), json.dumps(runs)],
        capture_output=True, text=True, timeout=timeout, cwd=cwd,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    results = []
    for i in range(len(runs)):
        rc = (out / f"{i}.rc").read_text() if (out / f"{i}.rc").exists() else "-1"
        results.append((int(rc), (out / f"{i}.out").read_text()))
    return results, done.stderr
