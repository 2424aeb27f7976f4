"""A script's report: its targets' verdicts and the file it writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def target(ok: bool, detail: str) -> dict[str, Any]:
    """One target of a report: met or not, and the figure that says so."""
    return {"ok": bool(ok), "detail": detail}


def write_json(path: Path, report: dict[str, Any], **dumps: Any) -> None:
    """A report as indented JSON, one line per value, ending in a newline."""
    path.write_text(json.dumps(report, indent=1, **dumps) + "\n", encoding="utf-8")
