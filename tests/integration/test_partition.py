"""A swarm cut in two by a partition that kills its connections, and healed, in network
namespaces this test creates: ``tests/support/partition.py`` says what it builds and
checks. Skipped, with the reason, where namespaces or nftables are missing; `.ci/run`
installs nftables."""

from __future__ import annotations

import pytest

from tests.support.namespaces import need_namespaces, nft_problem, run_unshared

RUN_S = 150  # ~35 s quiet


@pytest.mark.timeout(RUN_S + 30)
def test_a_partition_heals_without_restarts_or_bans() -> None:
    need_namespaces(nft_problem())
    code, result, log = run_unshared("tests.support.partition", "--mode", "reset", timeout=RUN_S)
    assert code == 0 and result["ok"], f"exit {code}: {result}\nlog:\n{log}"
    checks = result["checks"]
    assert checks["left_half_while_cut"] and checks["right_half_while_cut"]
    assert checks["nothing_crosses_while_cut"] and checks["crosses_after_heal"]
    assert set(checks["restarts"].values()) == {0} and set(checks["banned"].values()) == {0}
