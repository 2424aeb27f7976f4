"""structlog set-up: pretty lines on a terminal, JSON lines with ``--json-logs``."""

from __future__ import annotations

import logging
import os
import sys

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
