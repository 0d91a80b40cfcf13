"""structlog set-up: JSON lines for machines, console rendering on a terminal.

Log events carry connection and filter context, never record payloads or credentials.
Warnings a client can repeat at will (one per connection or per request) go through
``repeats`` (filters/log_limit.py): the first of each kind, then one per interval with the
number suppressed.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

from sluice.filters.log_limit import RepeatLimiter


def configure_logging(level: str = "info", fmt: str | None = None) -> None:
    fmt = (
        fmt or os.environ.get("SLUICE_LOG_FORMAT") or ("console" if sys.stderr.isatty() else "json")
    )
    renderer: structlog.typing.Processor
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer()
    else:
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
        ),
        # One write() per line, so lines from several --workers processes never interleave.
        logger_factory=structlog.WriteLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )


log = structlog.get_logger("sluice")
#: The proxy's shared limiter for warnings that repeat per connection or per request.
repeats = RepeatLimiter()
