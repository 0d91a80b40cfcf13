"""The Parquet telemetry sink: flat datasets per event type, published atomically.

Layout under the telemetry directory (docs/TELEMETRY.md, "Columnar layout")::

    <dataset>/date=YYYY-MM-DD/hour=HH/<instance_id>-<seq:06d>.parquet   published files
    _spool/<instance_id>-<seq:06d>/<dataset>.arrows                       open file (Arrow IPC)
    _spool/<instance_id>.lock                                           held while running

The writer thread appends the rows of each flush interval (``flush_seconds``, 1 s by default)
to the open spool file, one Arrow IPC stream per dataset, and flushes them to the OS. Rotation
(by spool size or age) splits the spool by hour, writes each part as a Parquet file under a
hidden temporary name and renames it into place, then deletes the spool: a reader that lists
``*.parquet`` never sees a half-written file. Published names are a function of the spool
name, so publishing the same spool twice (a crash between two renames) rewrites the same files
rather than adding copies.

After a ``kill -9`` the spool of the dead instance stays behind. The next sink that opens the
directory finds it (its lock file is no longer held), publishes every complete batch it holds
and logs (and records as a ``telemetry_dropped`` event) that events of the dead instance's last
flush interval may be lost.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import structlog

from sluice.proxy.telemetry.events import ProxyInfo, now_ms, telemetry_dropped_event
from sluice.proxy.telemetry.sinks import (
    DEFAULT_QUEUE_SIZE,
    DEFAULT_ROTATE_BYTES,
    DEFAULT_ROTATE_SECONDS,
    QueuedSink,
    TelemetryConfigError,
    check_rotation,
)
from sluice.telemetry_schema.columns import (
    FIRST_ROW,
    HOUR_MS,
    ROLLUPS,
    SCHEMAS,
    ColumnarBuffers,
    latest_versions,
    time_column,
    warm_up,
)
from sluice.telemetry_schema.integrity import Tagger, write_sidecar

log = structlog.get_logger("sluice.telemetry")

DEFAULT_FLUSH_SECONDS = 1.0
SPOOL = "_spool"
SPOOL_SUFFIX = ".arrows"


def read_stream_tolerant(path: Path) -> tuple[pa.Table | None, bool]:
    """Every complete record batch of an Arrow IPC stream file; ``complete`` False if torn."""
    batches: list[pa.RecordBatch] = []
    try:
        with pa.OSFile(str(path)) as f:
            reader = pa.ipc.open_stream(f)
            schema = reader.schema
            while True:
                try:
                    batches.append(reader.read_next_batch())
                except StopIteration:
                    return pa.Table.from_batches(batches, schema=schema), True
                except (pa.ArrowInvalid, OSError, EOFError):
                    return pa.Table.from_batches(batches, schema=schema), False
    except (pa.ArrowInvalid, OSError, EOFError):
        # Not even a schema reached the disk: the stream holds nothing.
        return None, False


def partition_dir(directory: Path, dataset: str, hour: int) -> Path:
    stamp = datetime.fromtimestamp(hour * HOUR_MS / 1000, tz=UTC)
    return directory / dataset / f"date={stamp:%Y-%m-%d}" / f"hour={stamp:%H}"


def published_name(target: Path) -> str:
    """A published file's name in the layout, ``<dataset>/date=.../hour=.../<name>``: what its
    tag covers besides its bytes (a copy under another dataset, hour or name does not verify)."""
    return "/".join(target.parts[-4:])


def write_parquet_atomic(table: pa.Table, target: Path, *, fsync: bool = True,
                         tagger: Tagger | None = None) -> None:
    """Write ``table`` to a hidden temporary name next to ``target``, then rename it; with
    ``tagger``, its tag (``<target>.tag``) is renamed into place first."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    if tagger is None:
        pq.write_table(table, tmp, compression="zstd", use_dictionary=True)
    else:
        # In memory first: the tag is over the bytes written, without reading them back.
        out = pa.BufferOutputStream()
        pq.write_table(table, out, compression="zstd", use_dictionary=True)
        data = out.getvalue()
        with open(tmp, "wb") as f:
            f.write(data)
        mac = tagger.file_mac(published_name(target))
        mac.update(data)
        write_sidecar(target, mac.tag(), fsync=fsync)
    if fsync:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.replace(tmp, target)


def publish_table(
    directory: Path, dataset: str, table: pa.Table, name: str, *, fsync: bool = True,
    tagger: Tagger | None = None,
) -> int:
    """Split one dataset's rows by hour and publish one Parquet file per hour; rows written."""
    if dataset in ROLLUPS:
        table = latest_versions(table)
    if table.num_rows == 0:
        return 0
    hours = pc.divide(table.column(time_column(dataset)).fill_null(0), HOUR_MS)
    for hour in pc.unique(hours).to_pylist():
        part = table.filter(pc.equal(hours, hour))
        write_parquet_atomic(
            part, partition_dir(directory, dataset, int(hour)) / f"{name}.parquet", fsync=fsync,
            tagger=tagger,
        )
    return int(table.num_rows)


def publish_spool(spool: Path, directory: Path, *, fsync: bool = True,
                  tagger: Tagger | None = None) -> tuple[int, bool, int]:
    """Publish a spool folder and delete it: (event rows, whether every stream was complete,
    latest event time in ms)."""
    events = 0
    complete = True
    latest = 0
    for stream in sorted(spool.glob(f"*{SPOOL_SUFFIX}")):
        dataset = stream.name[: -len(SPOOL_SUFFIX)]
        if dataset not in SCHEMAS:
            continue
        table, whole = read_stream_tolerant(stream)
        complete = complete and whole
        if table is None:
            continue
        written = publish_table(directory, dataset, table, spool.name, fsync=fsync,
                                tagger=tagger)
        if dataset in FIRST_ROW:
            events += int(pc.sum(pc.equal(table.column(FIRST_ROW[dataset]), 0)).as_py() or 0)
        elif dataset not in ROLLUPS and dataset != "connection_api":
            events += written
        if table.num_rows and dataset not in ROLLUPS:
            latest = max(latest, int(pc.max(table.column("time_ms")).as_py() or 0))
    shutil.rmtree(spool, ignore_errors=True)
    return events, complete, latest


class ParquetSink(QueuedSink):
    """Flat Parquet datasets per event type, ``date=/hour=`` partitioned (see module doc)."""

    kind = "parquet"

    def __init__(
        self,
        proxy: ProxyInfo,
        directory: str | os.PathLike[str],
        *,
        rotate_bytes: int = DEFAULT_ROTATE_BYTES,
        rotate_seconds: float = DEFAULT_ROTATE_SECONDS,
        flush_seconds: float = DEFAULT_FLUSH_SECONDS,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        fsync: bool = True,
        tagger: Tagger | None = None,
    ) -> None:
        check_rotation(rotate_bytes, rotate_seconds)
        if flush_seconds <= 0:
            raise TelemetryConfigError("telemetry.flush_seconds: must be > 0")
        self.directory = Path(directory)
        # Tags every published file, a dead instance's spool included (docs/TELEMETRY.md).
        self._tagger = tagger
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.flush_seconds = flush_seconds
        self._fsync = fsync
        self._buffers = ColumnarBuffers(proxy.instance_id)
        self._buffered = 0
        self._seq = 0
        self._spool: Path | None = None
        self._writers: dict[str, tuple[Any, Any]] = {}
        self._opened_at = 0.0
        self._flushed_at = time.monotonic()
        self._lock_fd: int | None = None
        self.completed_files: list[Path] = []
        self.recovered: list[dict[str, Any]] = []
        super().__init__(proxy, queue_size)

    # -- start: lock, recover what a dead instance left --------------------------------

    def _open_backend(self) -> None:
        warm_up()
        spool_root = self.directory / SPOOL
        spool_root.mkdir(parents=True, exist_ok=True)
        lock_path = spool_root / f"{self._proxy.instance_id}.lock"
        fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._lock_fd = fd
        self._recover(spool_root)

    def _recover(self, spool_root: Path) -> None:
        live: set[str] = {self._proxy.instance_id}
        for lock in spool_root.glob("*.lock"):
            instance = lock.name[: -len(".lock")]
            if instance in live:
                continue
            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                live.add(instance)  # another running proxy writes into this directory
                continue
            finally:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
        for spool in sorted(p for p in spool_root.iterdir() if p.is_dir()):
            instance = spool.name.rsplit("-", 1)[0]
            if instance in live:
                continue
            events, complete, latest = publish_spool(spool, self.directory, fsync=self._fsync,
                                                     tagger=self._tagger)
            note = {"spool": spool.name, "events": events, "complete": complete,
                    "last_event_ms": latest}
            self.recovered.append(note)
            log.warning(
                "telemetry from an unclean stop recovered",
                instance=instance,
                recovered_events=events,
                torn_write=not complete,
                lost="events of its last flush interval",
                flush_seconds=self.flush_seconds,
            )
            self._buffers.add(
                telemetry_dropped_event(
                    self._proxy,
                    dropped=0,
                    reason=(
                        f"unclean stop of instance {instance}: {events} events recovered from "
                        f"{spool.name}; events of its last flush interval after the last "
                        f"recovered one may be lost"
                    ),
                    since_ms=latest,
                    until_ms=now_ms(),
                )
            )

    # -- writing --------------------------------------------------------------------------

    def _write_batch(self, batch: list[dict[str, Any]], gap: dict[str, Any] | None) -> int:
        if self._lock_fd is None:
            # The directory could not be opened at start (or since): try again, and while it
            # fails the events count as dropped, not as written.
            self._open_backend()
        if gap is not None:
            self._buffers.add(gap)
        for event in batch:
            self._buffers.add(event)
        if time.monotonic() - self._flushed_at >= self.flush_seconds:
            self._flush()  # on failure the caller counts this batch as dropped
        else:
            self._buffered += len(batch)
        return len(batch)

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self._flushed_at >= self.flush_seconds:
            self._flush()
        if self._spool is not None and (
            now - self._opened_at >= self.rotate_seconds or self._spool_bytes() >= self.rotate_bytes
        ):
            self._rotate()

    def _spool_bytes(self) -> int:
        return sum(f.tell() for f, _w in self._writers.values())

    def _new_spool(self) -> Path:
        self._seq += 1
        spool = self.directory / SPOOL / f"{self._proxy.instance_id}-{self._seq:06d}"
        spool.mkdir(parents=True, exist_ok=False)
        self._spool = spool
        self._opened_at = time.monotonic()
        return spool

    def _flush(self) -> None:
        self._flushed_at = time.monotonic()
        # Events of earlier batches, counted as written when they were buffered.
        earlier, self._buffered = self._buffered, 0
        if not self._buffers.pending():
            return
        rows = self._buffers.rows_for_flush()
        try:
            spool = self._spool or self._new_spool()
            for dataset, batch in rows.items():
                entry = self._writers.get(dataset)
                if entry is None:
                    f = open(spool / f"{dataset}{SPOOL_SUFFIX}", "xb")  # closed in _rotate
                    entry = (f, pa.ipc.new_stream(f, SCHEMAS[dataset]))
                    self._writers[dataset] = entry
                entry[1].write_batch(batch)
                entry[0].flush()
        except Exception:
            with self._lock:
                self._written -= earlier
                self._dropped_error += earlier
            raise

    def _rotate(self) -> None:
        self._buffers.close_rollups()
        self._flush()
        spool = self._spool
        if spool is None:
            return
        for f, writer in self._writers.values():
            writer.close()
            f.flush()
            if self._fsync:
                os.fsync(f.fileno())
            f.close()
        self._writers.clear()
        self._spool = None
        publish_spool(spool, self.directory, fsync=self._fsync, tagger=self._tagger)
        self.completed_files.extend(sorted(self.directory.glob(f"*/*/*/{spool.name}.parquet")))

    def _close_backend(self) -> None:
        try:
            self._rotate()
        finally:
            if self._lock_fd is not None:
                lock = self.directory / SPOOL / f"{self._proxy.instance_id}.lock"
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()
                os.close(self._lock_fd)
                self._lock_fd = None
