"""One local SparkSession for all spark_audit tests (starting one costs ~6 s)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    if shutil.which("java") is None:
        pytest.skip("Java is not installed")
    from sluice.spark_audit.session import get_session

    session, created = get_session(
        "local[2]", {"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "2"}
    )
    yield session
    if created:
        session.stop()
