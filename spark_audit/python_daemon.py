"""The Python daemon Spark forks its Python workers from (``spark.python.daemon.module``).

Spark starts ``python -m <daemon module>`` once per executor and forks a worker from it for
each task slot. Its own daemon imports pyspark from ``pyspark.zip``, which Spark puts first on
the workers' ``PYTHONPATH``; Python keeps no compiled bytecode for a zip, so the daemon and
every new worker compile the pyspark modules they import from source again. Measured here: the
first Python job of a local session took 1.6-1.9 s, 0.9-1.2 s from the installed package.

This daemon drops that zip from ``sys.path`` when it is the one inside the pyspark package on
the path (the same files, installed with bytecode), imports ``pyspark.worker`` (pure Python, no
threads: safe to import before forking, unlike pyarrow or pandas) and runs Spark's daemon. A
zip of another Spark installation (a cluster's own ``SPARK_HOME``) stays first: its pyspark
must match that cluster's JVM.
"""

from __future__ import annotations

import os
import sys


def installed_first(path: list[str]) -> list[str]:
    """``path`` without a ``pyspark.zip`` that is the one inside a pyspark package on ``path``
    (``<entry>/pyspark/python/lib/pyspark.zip``, as the pyspark wheel installs it)."""
    drop = {
        os.path.join(entry, "pyspark", "python", "lib", "pyspark.zip")
        for entry in path
        if os.path.isfile(os.path.join(entry, "pyspark", "__init__.py"))
    }
    return [entry for entry in path if entry not in drop]


def main() -> None:
    sys.path[:] = installed_first(sys.path)
    import pyspark.worker  # noqa: F401  # imported once here, before the workers are forked
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
