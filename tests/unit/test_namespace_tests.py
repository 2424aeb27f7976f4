"""The namespace tests skip where namespaces or nftables are missing, and fail there
instead under ``SAPO_REQUIRE_NAMESPACES=1``, which ``.ci/run`` sets (issue 47): a real
pytest run of the partition test on a PATH without ``nft`` or ``unshare``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run_without_tools(tmp_path: Path, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/integration/test_partition.py", "-q",
         "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PATH": str(tmp_path), **env},
    )  # fmt: skip
    return done.stdout


@pytest.mark.parametrize(("require", "outcome"), [("", "1 skipped"), ("1", "1 failed")])
def test_a_namespace_test_skips_or_fails_as_told(
    tmp_path: Path, require: str, outcome: str
) -> None:
    out = _run_without_tools(tmp_path, SAPO_REQUIRE_NAMESPACES=require)
    assert outcome in out, out[-2000:]
    assert "no `nft` command" in out, out[-2000:]  # the reason, either way


def test_ci_requires_them() -> None:
    assert "SAPO_REQUIRE_NAMESPACES=1 make test" in (REPO / ".ci" / "run").read_text()
