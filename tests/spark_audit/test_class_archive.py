"""The driver JVM's class archive: where sessions look for it, and that a recorded one fits."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.spark_audit import class_archive, session


def test_no_archive_no_options(tmp_path: Path) -> None:
    assert class_archive.use_options(tmp_path / "missing.jsa") == ""


def test_an_archive_is_mapped_quietly(tmp_path: Path) -> None:
    archive = tmp_path / "spark-classes.jsa"
    archive.write_bytes(b"recorded")
    options = class_archive.use_options(archive).split()
    assert f"-XX:SharedArchiveFile={archive}" in options
    # A JVM that finds the archive unfit runs without it: no warning in every audit's output.
    assert "-Xlog:cds=off" in options and "-Xlog:cds+dynamic=off" in options


def test_recording_writes_at_exit(tmp_path: Path) -> None:
    assert class_archive.record_options(tmp_path / "a.jsa").split()[0] == (
        f"-XX:ArchiveClassesAtExit={tmp_path / 'a.jsa'}")


def test_the_archive_lives_in_the_environment() -> None:
    assert class_archive.archive_path().is_relative_to(sys.prefix)


def test_local_sessions_add_the_archive_when_there_is_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "spark-classes.jsa"
    monkeypatch.setattr(class_archive, "archive_path", lambda: archive)
    assert session.local_defaults()[session.JAVA_OPTIONS] == session.LOCAL_JAVA_OPTIONS
    archive.write_bytes(b"recorded")
    java = session.local_defaults()[session.JAVA_OPTIONS]
    assert java.startswith(session.LOCAL_JAVA_OPTIONS + " ")
    assert f"-XX:SharedArchiveFile={archive}" in java.split()


# A session whose JVM must map the archive (-Xshare:on fails the JVM's start otherwise), and
# runs a Python job.
_STRICT_SESSION = """
import sys
from sluice.spark_audit.session import JAVA_OPTIONS, LOCAL_JAVA_OPTIONS, get_session
spark, _ = get_session("local[2]", {
    JAVA_OPTIONS: f"{LOCAL_JAVA_OPTIONS} -Xshare:on -XX:SharedArchiveFile={sys.argv[1]}"})
print(sum(spark.sparkContext.parallelize(range(10), 2).map(lambda x: x * 2).collect()))
spark.stop()
"""


def _strict_session(archive: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _STRICT_SESSION, str(archive)],
                          capture_output=True, text=True, timeout=300)


def _recorded(tmp_path: Path) -> Path:
    """The archive ``scripts/dev.sh`` recorded for this environment, or, where there is none
    (pytest without the install script, or a recording that failed there), one recorded now
    by the same command."""
    installed = class_archive.archive_path()
    if installed.is_file():
        return installed
    archive = tmp_path / "classes.jsa"
    done = subprocess.run(
        [sys.executable, "-m", "sluice.spark_class_archive", "--to", str(archive)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"recorded {archive}" in done.stdout
    return archive


@pytest.mark.spark
def test_a_recorded_archive_fits_the_sessions_jvm(tmp_path: Path) -> None:
    if shutil.which("java") is None:
        pytest.skip("Java is not installed")
    archive = _recorded(tmp_path)
    assert archive.stat().st_size > 10_000_000
    fits = _strict_session(archive)
    assert fits.returncode == 0, fits.stderr[-2000:]
    assert fits.stdout.strip().splitlines()[-1] == "90"
    # The same check fails on an archive that does not fit.
    junk = tmp_path / "junk.jsa"
    junk.write_bytes(b"not an archive")
    assert _strict_session(junk).returncode != 0


@pytest.mark.spark
def test_recording_writes_the_archive_where_asked(tmp_path: Path) -> None:
    """Without ``--force`` an existing archive is kept (recording takes 40 s); ``--to`` names
    where."""
    existing = tmp_path / "kept.jsa"
    existing.write_bytes(b"recorded before")
    done = subprocess.run(
        [sys.executable, "-m", "sluice.spark_class_archive", "--to", str(existing)],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "kept" in done.stdout
    assert existing.read_bytes() == b"recorded before"
