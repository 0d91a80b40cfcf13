"""The Python workers' daemon: pyspark from the installed package, not from Spark's zip."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
import zipimport
from pathlib import Path
from typing import Any

import pytest

from sluice.spark_audit.python_daemon import (
    KEEP_PANDAS,
    WithoutPandas,
    forget_zip_importers,
    hide_pandas,
    installed_first,
    without_codeless_jars,
)


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


def _zip(path: Path, names: list[str]) -> str:
    with zipfile.ZipFile(path, "w") as zf:
        for name in names:
            zf.writestr(name, "")
    return str(path)


def test_jars_without_python_leave_the_path(tmp_path: Path) -> None:
    classes = _zip(tmp_path / "core.jar", ["org/apache/Spark.class", "META-INF/MANIFEST.MF"])
    with_code = _zip(tmp_path / "udfs.jar", ["org/A.class", "helpers/mod.py"])
    a_zip = _zip(tmp_path / "deps.zip", ["org/A.class"])  # zips are left to Python
    missing = str(tmp_path / "gone.jar")
    path = [str(tmp_path), classes, with_code, a_zip, missing]
    assert without_codeless_jars(path) == [str(tmp_path), with_code, a_zip, missing]


def test_zip_importers_of_archives_off_the_path_are_forgotten(tmp_path: Path) -> None:
    kept = _zip(tmp_path / "py4j.zip", ["py4j/__init__.py"])
    dropped = _zip(tmp_path / "pyspark.zip", ["pyspark/__init__.py"])
    folder = tmp_path / "site"
    folder.mkdir()
    cache: dict[str, Any] = {
        kept: zipimport.zipimporter(kept),
        kept + "/py4j": zipimport.zipimporter(kept + "/py4j"),
        dropped: zipimport.zipimporter(dropped),
        dropped + "/pyspark": zipimport.zipimporter(dropped + "/pyspark"),
        str(folder): None,
    }
    forget_zip_importers(cache, [str(folder), kept])
    assert sorted(cache) == sorted([kept, kept + "/py4j", str(folder)])


# pyarrow converts Python values with the finder in place, and pandas stays out; without it,
# the same conversion imports pandas (the control: pandas is installed with pyspark).
_CONVERT = """
import sys
{setup}
import pyarrow as pa
import pyarrow.compute as pc
assert pc.equal(pa.array([1, 2]), 1).to_pylist() == [True, False]
assert pa.scalar("x").as_py() == "x"
print("pandas" in sys.modules)
"""


def _convert(setup: str) -> str:
    done = subprocess.run([sys.executable, "-c", _CONVERT.format(setup=setup)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_pyarrow_converts_values_without_pandas() -> None:
    assert _convert("") == "True"
    hidden = ("from sluice.spark_audit.python_daemon import WithoutPandas\n"
              "sys.meta_path.insert(0, WithoutPandas())")
    assert _convert(hidden) == "False"


def test_hidden_pandas_says_how_to_keep_it() -> None:
    finder = WithoutPandas()
    with pytest.raises(ModuleNotFoundError, match=KEEP_PANDAS):
        finder.find_spec("pandas")
    with pytest.raises(ModuleNotFoundError):
        finder.find_spec("pandas.core.frame")
    assert finder.find_spec("pyarrow") is None
    assert finder.find_spec("pandasql") is None


def test_pandas_is_hidden_unless_kept_or_already_there() -> None:
    meta_path: list[Any] = ["finder"]
    hide_pandas({}, meta_path, {})
    assert isinstance(meta_path[0], WithoutPandas) and meta_path[1:] == ["finder"]
    for environ, modules in (({KEEP_PANDAS: "1"}, {}), ({}, {"pandas": object()})):
        untouched: list[Any] = ["finder"]
        hide_pandas(environ, untouched, modules)
        assert untouched == ["finder"]


def _worker_modules(_: Any) -> list[bool]:
    import sys

    import pyarrow as pa

    pa.scalar(1)
    return ["pandas" in sys.modules]


def test_workers_run_without_pandas(spark: Any) -> None:
    assert spark.sparkContext.parallelize([0, 1], 2).flatMap(_worker_modules).collect() == [
        False, False]


def _worker_pyspark(_: Any) -> list[str]:
    import pyspark

    return [pyspark.__file__ or ""]


def _worker_archives(_: Any) -> list[str]:
    """The archives on a worker's path and those it keeps zip importers of."""
    import sys
    import zipimport

    return [*(p for p in sys.path if p.endswith((".jar", ".zip"))),
            *(k for k, v in sys.path_importer_cache.items()
              if isinstance(v, zipimport.zipimporter))]


def test_workers_import_the_installed_pyspark(spark: Any) -> None:
    """The session's workers fork from ``python_daemon``: their pyspark is a package with
    bytecode on disk, not a module inside ``pyspark.zip``."""
    assert spark.conf.get("spark.python.daemon.module") == "sluice.spark_audit.python_daemon"
    files = spark.sparkContext.parallelize([0, 1], 2).flatMap(_worker_pyspark).collect()
    assert len(files) == 2
    for file in files:
        assert ".zip" + os.sep not in file, file
        assert os.path.isfile(file), file


def test_workers_keep_no_archive_without_python(spark: Any) -> None:
    """Spark's core jar (classes only) and pyspark.zip are neither on the workers' path nor
    cached as importers: a new worker's first task re-reads every cached archive."""
    archives = spark.sparkContext.parallelize([0], 1).flatMap(_worker_archives).collect()
    assert archives  # py4j's zip stays
    assert not [a for a in archives if a.endswith(".jar") or "pyspark.zip" in a], archives
