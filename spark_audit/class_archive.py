"""Where the driver JVM's class archive lives, and the JVM options that use or record it.

A local audit job runs Spark's driver and executors in one JVM, started anew by every
``sluice audit``; that JVM spends seconds loading and verifying the same few thousand classes
of Spark's jars each time. Java's class-data sharing (CDS) maps them from an archive recorded
once instead (``-XX:SharedArchiveFile``). Measured on the 10M-event bench data, three runs of
each, alternating: session start 3.6-4.4 s instead of 8.0-8.7 s, the first run of the job
5.8-6.9 s instead of 6.5-7.4 s.

The archive is recorded by ``python -m sluice.spark_class_archive`` (``scripts/dev.sh``
does it when it installs): a small audit in a JVM started with ``record_options``, which
writes the classes it loaded when it exits. It sits in the virtualenv (``sys.prefix``), next to
the jars it was recorded from. The JVM checks that the archive fits (the same JVM build, the
same jars, unchanged) and silently runs without it otherwise: a pyspark or Java upgrade makes it
useless, not wrong, until it is recorded again. ``use_options`` is empty when there is no
archive, so nothing depends on it.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The JVM says nothing when the archive does not fit (it then loads classes from the jars):
# the fallback is harmless, the warning would be noise in every audit.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_path() -> Path:
    """The archive of this Python environment (its Spark jars are in it too)."""
    return Path(sys.prefix) / "share" / "sluice" / "spark-classes.jsa"


def use_options(path: Path | None = None) -> str:
    """JVM options that map the archive, or "" when there is none."""
    archive = path or archive_path()
    return f"-XX:SharedArchiveFile={archive} {_QUIET}" if archive.is_file() else ""


def record_options(target: Path) -> str:
    """JVM options that write the classes loaded to ``target`` when the JVM exits."""
    return f"-XX:ArchiveClassesAtExit={target} {_QUIET}"
