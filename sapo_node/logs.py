"""structlog set-up: pretty lines on a terminal, JSON lines with ``--json-logs``; and
``QuietLog``, for a line that a stranger could make a node write at will."""

from __future__ import annotations

import logging
import math
import os
import sys
from collections import OrderedDict
from typing import Any

import structlog


class _StderrLogger:
    """Writes each line to whatever ``sys.stderr`` is now (it may be replaced later)."""

    def __init__(self, *args: object) -> None:
        pass

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


def configure_logging(
    json_logs: bool = False, level: int = logging.INFO, *, models: bool = True
) -> None:
    """Route structlog and stdlib logging to stderr in one format. ``models``: the process
    may load a model, so transformers is quieted too; a process that loads none (the
    network process, a relay) leaves it unimported (about a second of start-up)."""
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso" if json_logs else "%H:%M:%S", utc=json_logs),
    ]
    if json_logs:
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=_StderrLogger,
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")
    # Libraries' progress bars and advice are noise in a daemon's log.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    if not models:
        return
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


class QuietLog:
    """At most one line per key each ``every_s``; a key's next line says how many it held
    back. Keys beyond ``limit`` push out the one logged longest ago.

    >>> q = QuietLog(60.0, 2)
    >>> q.take("a", 0.0), q.take("a", 1.0), q.take("a", 2.0), q.take("a", 60.0)
    (0, None, None, 2)
    """

    def __init__(self, every_s: float, limit: int) -> None:
        self.every_s, self.limit = every_s, limit
        self.keys: OrderedDict[Any, tuple[float, int]] = OrderedDict()  # when logged, held

    def take(self, key: Any, now: float) -> int | None:
        """None if a line for ``key`` is held back at ``now``, else how many were held
        back since its last line."""
        logged, held = self.keys.get(key, (-math.inf, 0))
        if now - logged < self.every_s:
            self.keys[key] = (logged, held + 1)
            return None
        self.keys[key] = (now, 0)
        self.keys.move_to_end(key)
        while len(self.keys) > self.limit:
            self.keys.popitem(last=False)
        return held
