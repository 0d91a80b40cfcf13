"""The Python workers' daemon: pyspark from the installed package, not from Spark's zip."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sluice.spark_audit.python_daemon import installed_first


def _package(root: Path) -> Path:
    """A pyspark package under ``root`` as the wheel installs it, with its zip."""
    (root / "pyspark" / "python" / "lib").mkdir(parents=True)
    (root / "pyspark" / "__init__.py").write_text("")
    zip_path = root / "pyspark" / "python" / "lib" / "pyspark.zip"
    zip_path.write_bytes(b"")
    return zip_path


def test_the_installed_packages_own_zip_leaves_the_path(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    zip_path = _package(site)
    py4j = str(tmp_path / "py4j.zip")
    path = [str(tmp_path / "cwd"), str(zip_path), py4j, str(site)]
    assert installed_first(path) == [str(tmp_path / "cwd"), py4j, str(site)]


def test_another_installations_zip_stays_first(tmp_path: Path) -> None:
    """A cluster's SPARK_HOME zip must match its JVM: kept, and ahead of the package."""
    site = tmp_path / "site-packages"
    _package(site)
    cluster_zip = str(tmp_path / "spark-home" / "python" / "lib" / "pyspark.zip")
    path = [cluster_zip, str(site)]
    assert installed_first(path) == path


def test_no_package_on_the_path_changes_nothing(tmp_path: Path) -> None:
    zip_path = _package(tmp_path / "elsewhere")
    path = [str(zip_path), str(tmp_path / "site-packages")]
    assert installed_first(path) == path


def _worker_pyspark(_: Any) -> list[str]:
    import pyspark

    return [pyspark.__file__ or ""]


def test_workers_import_the_installed_pyspark(spark: Any) -> None:
    """The session's workers fork from ``python_daemon``: their pyspark is a package with
    bytecode on disk, not a module inside ``pyspark.zip``."""
    assert spark.conf.get("spark.python.daemon.module") == "sluice.spark_audit.python_daemon"
    files = spark.sparkContext.parallelize([0, 1], 2).flatMap(_worker_pyspark).collect()
    assert len(files) == 2
    for file in files:
        assert ".zip" + os.sep not in file, file
        assert os.path.isfile(file), file
