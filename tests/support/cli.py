"""Running the command line in-process."""

from __future__ import annotations

import pytest

from sapo_node.cli import main


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``sapo-node ARGV``: its exit code, stdout and stderr."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err
