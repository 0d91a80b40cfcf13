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

It also drops the archives that hold no Python code (Spark puts its ``spark-core`` jar, 5,973
entries, on the workers' path) and forgets the zip importers of every archive no longer on the
path: a new worker's first task adds Spark's files folder to ``sys.path`` and calls
``importlib.invalidate_caches()``, which reads the directory of every cached zip importer
again. Measured: 0.5 s of every new worker's first task (pyspark.zip, the jar and py4j), which
a cold job pays once per core.

And it hides pandas from the workers (``WithoutPandas``). The job's tasks use Arrow only, but
pyarrow imports pandas, when it is installed, the first time it converts a Python value (a
scalar in a compute call): 0.45 s of every new worker. Measured on the 10M-event bench data,
three cold runs each, alternating: 7.0-10.0 CPU s and 4.4-6.2 s instead of 9.5-11.6 CPU s and
5.8-7.2 s. A worker that needs pandas anyway (code of the user's own on the session) gets it
with ``SLUICE_WORKER_PANDAS=1`` in the executors' environment.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
import zipfile
import zipimport
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

KEEP_PANDAS = "SLUICE_WORKER_PANDAS"


def installed_first(path: list[str]) -> list[str]:
    """``path`` without a ``pyspark.zip`` that is the one inside a pyspark package on ``path``
    (``<entry>/pyspark/python/lib/pyspark.zip``, as the pyspark wheel installs it)."""
    drop = {
        os.path.join(entry, "pyspark", "python", "lib", "pyspark.zip")
        for entry in path
        if os.path.isfile(os.path.join(entry, "pyspark", "__init__.py"))
    }
    return [entry for entry in path if entry not in drop]


def _holds_python(archive: str) -> bool:
    try:
        with zipfile.ZipFile(archive) as zf:
            return any(name.endswith((".py", ".pyc")) for name in zf.namelist())
    except (OSError, zipfile.BadZipFile):
        return True  # not an archive we can read: keep it, as Python would


def without_codeless_jars(path: list[str]) -> list[str]:
    """``path`` without the ``.jar`` files that hold no Python module (nothing can be
    imported from them)."""
    return [entry for entry in path
            if not (entry.endswith(".jar") and os.path.isfile(entry)
                    and not _holds_python(entry))]


def forget_zip_importers(cache: MutableMapping[str, Any], path: list[str]) -> None:
    """Drop from ``cache`` (``sys.path_importer_cache``) the zip importers of archives that
    are not on ``path`` (nor folders inside such an archive)."""
    archives = [entry for entry in path if os.path.isfile(entry)]
    for key, finder in list(cache.items()):
        if isinstance(finder, zipimport.zipimporter) and key not in path and not any(
                key.startswith(archive + os.sep) for archive in archives):
            del cache[key]


class WithoutPandas(importlib.abc.MetaPathFinder):
    """A finder, first on ``sys.meta_path``, for which pandas is not installed: pyarrow then
    converts values without it (its pandas shim catches the ``ImportError``)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: Any = None) -> None:
        if fullname == "pandas" or fullname.startswith("pandas."):
            raise ModuleNotFoundError(
                f"pandas is hidden from the audit job's Python workers ({KEEP_PANDAS}=1 in "
                "their environment keeps it)", name=fullname)
        return None


def hide_pandas(environ: Mapping[str, str], meta_path: list[Any],
                modules: Mapping[str, Any]) -> None:
    """Put ``WithoutPandas`` first on ``meta_path`` unless ``KEEP_PANDAS`` is ``1`` in
    ``environ`` or pandas is already imported."""
    if environ.get(KEEP_PANDAS) != "1" and "pandas" not in modules:
        meta_path.insert(0, WithoutPandas())


def main() -> None:
    sys.path[:] = without_codeless_jars(installed_first(sys.path))
    forget_zip_importers(sys.path_importer_cache, sys.path)
    hide_pandas(os.environ, sys.meta_path, sys.modules)
    import pyspark.worker  # noqa: F401  # imported once here, before the workers are forked
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
