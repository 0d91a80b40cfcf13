"""Loading a filter module and running it: the host API the chain, the CLI and tests use.

    from sluice.filters.runtime import load_filter
    f = load_filter(spec)                      # FilterSpec from sluice.filters.config
    result = f.run_batch(ctx, records)         # -> BatchResult, one Decision per record
    verdict = f.run_admin(resource)            # -> AdminVerdict (Sluice ABI with sluice_admin)

A ``builtin:NAME`` served by host code (filters/host.py; ``builtin:encrypt``) loads without
any Wasm: its `HostRunner` takes the place of an ABI adapter in the same `LoadedFilter`.

`load_filter` reads the module, compiles it through the shared ModuleCache, picks the ABI from
the module's exports (Sluice ABI v1 if it exports ``sluice_abi_version``; the Kafka Connect ABI
if ``function`` names a ``() -> ()``/``() -> i64`` export and ``alloc`` is exported; the in-place
ABI if ``function`` (default ``transform_record``) has signature ``(i32, i32, i32, i32) -> i64``),
instantiates it once (so a broken module or config fails at start-up, not on the first record)
and returns a `LoadedFilter`.

A trap, timeout, memory exhaustion, invalid output or guest-reported error never escapes
`run_batch`/`run_admin`: it is counted, logged (without payloads) and turned into decisions by
the filter's ``on_error`` policy: ``reject`` -> REJECT, ``pass`` -> KEEP, ``dead-letter`` ->
REJECT with ``dead_letter=True``. A host filter's `PartitionError` is the exception: it is
counted and logged, then passes to the pipeline, which fails that partition with its code.
A wasmtime store is single-threaded, so each call holds one instance. A filter gets one instance
and its calls are serialised, unless its spec is `poolable` (it keeps no state between calls:
builtin pii-mask and rules, or ``stateless: true``): then a call that finds every instance busy
makes another, up to one per thread calling at once and at most `MAX_INSTANCES`, so the filter
thread pool's threads run it side by side (issue 29: a Fetch response's partitions on two cores). An
instance is made only where the thread may wait (never inline on the event loop) and kept until
the filter is closed; each costs its module's linear memory (up to ``max_memory_mb``).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Final

import structlog
import wasmtime
from wasmtime import component as wc

from sluice.codec.lz4_section import PendingSection, SectionRefused
from sluice.codec.records import Buffer
from sluice.filters import blocking
from sluice.filters.abi_base import AbiRunner, FilterLoadError
from sluice.filters.abi_component import ComponentAbi
from sluice.filters.abi_connect import ConnectAbi, connect_function
from sluice.filters.abi_inplace import InPlaceAbi, inplace_function
from sluice.filters.abi_sluice import SluiceAbi, is_sluice_module
from sluice.filters.admin import AdminResource, AdminVerdict, decode_admin_output
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext, RecordLike
from sluice.filters.decisions import Action, BatchResult, Decision, PartitionError
from sluice.filters.effects import effect
from sluice.filters.engine import FilterEngine, default_engine
from sluice.filters.guest import GuestFailure
from sluice.filters.host import BlockRunner, HostRunner
from sluice.filters.log_limit import RepeatLimiter
from sluice.filters.module_cache import ModuleCache
from sluice.filters.native_io import Finish, NativeOutput
from sluice.filters.records_io import AbiError

__all__ = ["MAX_INSTANCES", "FilterLoadError", "LoadedFilter", "load_filter", "shared_cache"]

#: Instances of one poolable filter at most (in the proxy the filter threads bound them first).
MAX_INSTANCES: Final = 8

log = structlog.get_logger("sluice.filters")


_caches: dict[tuple[int, str | None], ModuleCache] = {}
_caches_lock = threading.Lock()


def shared_cache(engine: FilterEngine | None = None,
                 cache_dir: str | Path | None = None) -> ModuleCache:
    """The process-wide ModuleCache for (engine, cache_dir)."""
    eng = engine or default_engine()
    key = (id(eng), None if cache_dir is None else str(cache_dir))
    with _caches_lock:
        cache = _caches.get(key)
        if cache is None or cache.engine is not eng:
            cache = _caches[key] = ModuleCache(eng, cache_dir)
        return cache


def _select_abi(module: wasmtime.Module | wc.Component, spec: FilterSpec, who: str,
                engine: FilterEngine) -> AbiRunner | ComponentAbi:
    if isinstance(module, wc.Component):
        return ComponentAbi(engine, module, spec, who)
    if is_sluice_module(module):
        return SluiceAbi(engine, module, spec, who)
    if connect_function(module, spec.function):
        return ConnectAbi(engine, module, spec, who)
    if inplace_function(module, spec.function):
        return InPlaceAbi(engine, module, spec, who)
    entry = spec.function or "transform_record"
    raise FilterLoadError(
        f"{who}: module matches no supported ABI: export sluice_abi_version (Sluice ABI v1), "
        f"or {entry}(i32, i32, i32, i32) -> i64 (in-place ABI), or set 'function' to a "
        "() -> () export plus alloc/dealloc (Kafka Connect ABI)")


def _host_runner(name: str, spec: FilterSpec, who: str) -> HostRunner:
    if "admin" in spec.apply_to:
        raise FilterLoadError(f"{who}: builtin:{name} cannot act on admin requests (remove "
                              "admin from apply_to)")
    if name == "block":
        return BlockRunner(spec, who)
    # Imported here: its module imports the cryptography package.
    from sluice.crypto.record_filter import EncryptRunner

    return EncryptRunner(spec, who)


def load_filter(spec: FilterSpec, *, cache: ModuleCache | None = None,
                engine: FilterEngine | None = None,
                cache_dir: str | Path | None = None) -> LoadedFilter:
    """Load, check and instantiate the module of `spec` (FilterLoadError on any problem)."""
    who = f"filter {spec.name!r} ({spec.where})"
    host = spec.host_builtin
    if host is not None:
        host_runner = _host_runner(host, spec, who)
        return LoadedFilter(spec, host_runner.identity(), host_runner, "host", 0.0)
    if cache is None:
        cache = shared_cache(engine, cache_dir)
    eng = cache.engine
    path = spec.module_path
    try:
        wasm = path.read_bytes()
    except OSError as exc:
        raise FilterLoadError(f"{who}: cannot read module {path}: "
                              f"{exc.strerror or exc}") from None
    try:
        compiled = cache.load(wasm)
    except wasmtime.WasmtimeError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "invalid module"
        raise FilterLoadError(f"{who}: {path} is not a valid Wasm module: {first}") from None
    runner = _select_abi(compiled.module, spec, who, eng)
    if "admin" in spec.apply_to and isinstance(runner, ComponentAbi) and not runner.supports_admin:
        raise FilterLoadError(f"{who}: bound to admin but the component does not export admin "
                              "(a Python filter registers @sluice_filter.on_admin)")
    if "admin" in spec.apply_to and not runner.supports_admin:
        if runner.abi.startswith("sluice-v1"):
            raise FilterLoadError(f"{who}: bound to admin but the module does not export "
                                  "sluice_admin")
        raise FilterLoadError(f"{who}: {runner.abi} ABI modules cannot act on admin requests "
                              "(remove admin from apply_to)")
    try:
        runner.guest()
    except GuestFailure as exc:
        raise FilterLoadError(f"{who}: instantiation failed: {exc}") from None
    module = compiled.module
    # Further instances of a stateless filter, made on demand (their first call instantiates
    # them; a failure there is a failed call, under the filter's on_error policy).
    more = (lambda: _select_abi(module, spec, who, eng)) if spec.poolable else None
    return LoadedFilter(spec, compiled.sha256, runner, compiled.origin,
                        compiled.load_seconds, more=more)


class LoadedFilter:
    """A filter ready to run. Thread-safe (calls are serialised, unless the filter is poolable
    or a host filter whose runner may be shared: `concurrent`)."""

    def __init__(self, spec: FilterSpec, sha256: str,
                 runner: AbiRunner | HostRunner | ComponentAbi,
                 origin: str,
                 load_seconds: float,
                 more: Callable[[], AbiRunner | ComponentAbi] | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.sha256 = sha256
        self.abi = runner.abi
        #: The ABI's optional parts this module exports (docs/FILTER_ABI.md, capabilities).
        self.capabilities = runner.capabilities
        self.origin = origin
        self.load_seconds = load_seconds
        self._runner = runner
        self._lock = threading.Lock()  # the instance, when the filter has only one
        #: Poolable filters: a factory of further instances, the idle ones (last used on top:
        #: its memory is warm), and every one made.
        self._more = more
        #: Host filters: the directions whose calls share the one runner without its lock
        #: (`HostRunner.concurrent`).
        self._concurrent: frozenset[str] = (
            runner.concurrent if isinstance(runner, HostRunner) else frozenset())
        self._idle: list[AbiRunner | HostRunner | ComponentAbi] = [runner]
        self._made: list[AbiRunner | HostRunner | ComponentAbi] = [runner]
        self._pool = threading.Condition()
        self._creating = 0
        self._waiting = 0  # threads waiting in `_take` for an idle instance
        self._limit = MAX_INSTANCES
        self._counts = threading.Lock()  # failures and native_fallbacks, counted from any thread
        self._native_failure = threading.local()  # the last failed native call, per thread
        self.failures: Counter[str] = Counter()
        #: Fast-path calls that failed and were redone through run_batch.
        self.native_fallbacks = 0
        self._log = log.bind(filter=spec.name, sha256=sha256[:16], abi=runner.abi)
        #: Failures repeat per batch as fast as clients retry (a blocked topic, a failing
        #: filter): each kind is logged once, then once per interval with a suppressed count.
        #: The counters above and the metrics still see every one.
        self.repeats = RepeatLimiter()

    @contextmanager
    def _instance(self, direction: str | None = None
                  ) -> Iterator[AbiRunner | HostRunner | ComponentAbi]:
        """An instance for this thread alone until the block ends: the filter's one instance
        under its lock or, poolable, an idle one or a new one. On the event loop (a job
        inline) only one free now, else `blocking.WouldBlock`: another thread's run (a KMS
        call) must not stall the loop, nor may an instantiation. A host runner that may be
        called concurrently in `direction` is shared without the lock."""
        if direction is not None and direction in self._concurrent:
            yield self._runner
            return
        runner = self._acquire()
        try:
            yield runner
        finally:
            self._release(runner)

    def _acquire(self) -> AbiRunner | HostRunner | ComponentAbi:
        """Take an instance as `_instance` does; the caller must `_release` it."""
        if self._more is None:
            blocking.acquire(self._lock)
            return self._runner
        try:
            # An idle instance without the condition's lock: list.pop is atomic under the
            # GIL, and the condition (Python code: four calls a batch) is needed only to wait.
            return self._idle.pop()
        except IndexError:
            return self._take(self._more)

    def _release(self, runner: AbiRunner | HostRunner | ComponentAbi) -> None:
        if self._more is None:
            self._lock.release()
            return
        self._idle.append(runner)
        # A waiter counts itself before its last look at `_idle` (`_take`), so either it
        # sees this instance there or this sees it counted and wakes it.
        if self._waiting:
            with self._pool:
                self._pool.notify()

    def _take(self, more: Callable[[], AbiRunner | ComponentAbi]
              ) -> AbiRunner | HostRunner | ComponentAbi:
        while True:
            try:
                return self._idle.pop()
            except IndexError:
                pass
            with self._pool:
                if self._idle:
                    continue  # released meanwhile
                may_wait = blocking.allowed()
                if may_wait and len(self._made) + self._creating < self._limit:
                    self._creating += 1
                    break
                if not may_wait:
                    raise blocking.WouldBlock()
                self._waiting += 1
                try:
                    if not self._idle:
                        self._pool.wait()
                finally:
                    self._waiting -= 1
        made: AbiRunner | ComponentAbi | None = None
        try:
            made = more()
        except Exception:
            # Not expected (the module and its spec loaded already): the instances made so
            # far serve on, and the call waits for one of them.
            self._log.warning("filter_instance_not_made", instances=len(self._made),
                              exc_info=True)
        with self._pool:
            self._creating -= 1
            if made is None:
                self._limit = len(self._made)
                self._pool.notify()
            else:
                self._made.append(made)
        return made if made is not None else self._take(more)

    @property
    def instances(self) -> int:
        """Instances made so far (1 unless the filter is poolable and ran on several threads
        at once)."""
        return len(self._made)

    @property
    def poolable(self) -> bool:
        """Whether calls may run on several instances at once (`FilterSpec.poolable`)."""
        return self._more is not None

    def concurrent(self, direction: str) -> bool:
        """Whether calls in `direction` may run on several threads at once: a poolable
        filter (an instance each), or a host filter that says its runner may be shared
        (`HostRunner.concurrent`)."""
        return self._more is not None or direction in self._concurrent

    @property
    def supports_admin(self) -> bool:
        return self._runner.supports_admin

    @property
    def nests(self) -> bool:
        """Whether the filter seals what earlier filters produced, so fetch must run it
        before them (host filters that say so: ``builtin:encrypt``)."""
        return bool(getattr(self._runner, "nests", False))

    @property
    def never_waits(self) -> bool:
        """Whether a run never waits on a thread inside `blocking.forbidden()` (it raises
        `blocking.WouldBlock` there instead), so it may run inline on the event loop: a Wasm
        guest (bounded by its own deadline) or a host filter that says so."""
        runner = self._runner
        return not isinstance(runner, HostRunner) or runner.never_waits

    @property
    def cost_follows_size(self) -> bool:
        """Whether a run's cost follows the records' size alone (the proxy's own native code;
        a guest's never does: records can be crafted to make it slow)."""
        runner = self._runner
        return isinstance(runner, HostRunner) and runner.cost_follows_size

    @property
    def reserved_header_prefix(self) -> str | None:
        """Header-name prefix only this filter may write (producers may not send one)."""
        return getattr(self._runner, "reserved_header_prefix", None)

    @property
    def native(self) -> bool:
        """Whether the module offers ``sluice_filter_records`` (the host's fast path), or the
        host filter its `run_native`."""
        runner = self._runner
        if isinstance(runner, HostRunner):
            return runner.has_native
        return isinstance(runner, (SluiceAbi, ComponentAbi)) and runner.has_native

    @property
    def takes_pending(self) -> bool:
        """Whether `run_native` takes a `PendingSection` (a Sluice ABI module with the native
        entry point: the section is decompressed into its memory)."""
        runner = self._runner
        return isinstance(runner, SluiceAbi) and runner.has_native

    @property
    def pending_room(self) -> int:
        """The largest `PendingSection.room` given to `run_native` (0 when it takes none):
        the guest allocates the room, which a frame's block headers may claim at 255 times
        what it holds, so at most half the memory cap (the rest for the guest's own data and
        output); a batch claiming more is opened in Python and passed at its real size."""
        return self.spec.max_memory_mb * 1024 * 1024 // 2 if self.takes_pending else 0

    @property
    def can_screen(self) -> bool:
        """Whether `screen_native` can check a records section for the reserved prefix."""
        runner = self._runner
        return isinstance(runner, HostRunner) and runner.can_screen

    def screen_native(self, records: Buffer, count: int) -> tuple[int, str] | None:
        """(record index, header name) of the first header of a records section carrying
        `reserved_header_prefix`, or None (exceptions when the section cannot be read)."""
        runner = self._runner
        if not isinstance(runner, HostRunner):
            raise TypeError(f"filter {self.name} reserves no header prefix")
        return runner.screen_native(records, count)

    def run_native(self, ctx: RecordContext, records: Buffer | PendingSection, count: int, *,
                   offset_base: int = 0, timestamp_base: int = 0,
                   finish: Finish | None = None) -> NativeOutput | None:
        """Run the filter over a records section in Kafka's encoding (see native_io); a
        `PendingSection` only where `takes_pending` (SectionRefused when the codec refuses
        it, the filter not called). `finish`: what a Sluice ABI guest's new section is given
        to where it lies, while this call still holds the instance
        (`native_io.decode_native_output`), where the filter is poolable; the other runners,
        and a filter whose one instance is held under its lock, copy the section out.

        Returns None when the call failed in any way, without counting or logging it: the
        caller then runs the batch through `run_batch`, which applies, counts and logs the
        failure policy once. The failure is remembered for that very batch (same context,
        bases and count, same thread), so `run_batch` does not call the guest again: a filter
        that spins to its deadline costs one deadline, not two.
        """
        runner = self._runner
        if isinstance(runner, HostRunner):
            if isinstance(records, PendingSection):
                raise TypeError("a host filter takes no pending records section")
            return self._run_host_native(runner, ctx, records, count, offset_base,
                                         timestamp_base)
        if not isinstance(runner, (SluiceAbi, ComponentAbi)) or not runner.has_native:
            return None
        # `_instance()` spelt out: this is the per-batch path, and a generator-based context
        # manager costs a few µs of a one-record batch.
        if self._more is None:
            # One instance under the filter's lock: a finish (the batch's compression) would
            # hold the lock through it, and every other thread's batches behind it. The
            # section is copied out instead, and compressed once the lock is released.
            finish = None
        instance = self._acquire()
        try:
            assert isinstance(instance, (SluiceAbi, ComponentAbi))
            if isinstance(records, PendingSection):
                if not isinstance(instance, SluiceAbi):
                    raise TypeError("a pending records section needs a Sluice ABI module")
                return instance.run_native(ctx, records, count, offset_base, timestamp_base,
                                           finish)
            if isinstance(instance, SluiceAbi):
                return instance.run_native(ctx, records, count, offset_base, timestamp_base,
                                           finish)
            return instance.run_native(ctx, records, count, offset_base, timestamp_base)
        except SectionRefused:
            # The batch, not the filter, failed (no fallback counted); the instance is kept
            # unless the inputs allocated for refused batches add up (SluiceAbi._unpaired).
            raise
        except Exception as exc:
            if not isinstance(exc, GuestFailure):
                instance.discard()
            effect(self._count_fallback)
            if isinstance(exc, GuestFailure) and exc.kind == "timeout":
                # A deadline is spent: do not spend it a second time on the same batch.
                # Kept without its traceback, whose frames hold the batch's views (and, but
                # for native_call's release, a buffer exported from one): frames kept alive
                # by a failure end up in reference cycles, where CPython 3.11's collector
                # clears an exported memoryview and then crashes freeing it (gh-77894).
                self._native_failure.last = (
                    (id(ctx), offset_base, timestamp_base, count), exc.with_traceback(None))
            return None
        finally:
            self._release(instance)

    def _run_host_native(self, runner: HostRunner, ctx: RecordContext, records: Buffer,
                         count: int, offset_base: int, timestamp_base: int
                         ) -> NativeOutput | None:
        """A host filter's fast path: PartitionError is counted, logged and raised exactly as
        `run_batch` does; anything else returns None (`run_batch` redoes the batch and applies
        its own rules)."""
        if not runner.has_native:
            return None
        # `_instance()` spelt out, as in `run_native` (a generator-based context manager costs
        # a few µs per batch): shared where the runner says so, else under the lock.
        shared = ctx.direction in self._concurrent
        if not shared:
            self._acquire()
        try:
            return runner.run_native(ctx, records, count, offset_base, timestamp_base)
        except PartitionError as exc:
            self._partition_error(exc, ctx, count)
            raise
        except Exception:
            effect(self._count_fallback)
            return None
        finally:
            if not shared:
                self._release(runner)

    # Failure counts and warnings go through `effects.effect`: a Fetch partition filtered in
    # runs on several threads applies them only for the batches a serial pass would reach.
    def _count_fallback(self) -> None:
        with self._counts:
            self.native_fallbacks += 1

    def _partition_error(self, exc: PartitionError, ctx: RecordContext, records: int) -> None:
        def counted() -> None:
            with self._counts:
                self.failures["partition"] += 1
            self.repeats.warning(self._log, ("filter_partition_error", exc.code, ctx.topic),
                                 "filter_partition_error", code=exc.code,
                                 reason=exc.message[:200], topic=ctx.topic,
                                 partition=ctx.partition, records=records)

        effect(counted)

    def _record_failure(self, ctx: RecordContext, reason: str, index: int) -> None:
        with self._counts:
            self.failures["record"] += 1
        self.repeats.warning(self._log, ("filter_failure", "record", ctx.topic),
                             "filter_failure", call="record", reason=reason[:200],
                             policy=self.spec.on_error, topic=ctx.topic,
                             partition=ctx.partition, record_index=index)

    @property
    def instantiations(self) -> int:
        """How many instances were created (1 + re-instantiations after failures, + the
        pool's further instances)."""
        return sum(r.instantiations for r in list(self._made))

    def _policy(self, failure: str) -> Decision:
        on_error = self.spec.on_error
        if on_error == "pass":
            return Decision(Action.KEEP, failure=failure)
        reason = f"filter {self.name} failed: {failure}"
        return Decision(Action.REJECT, reason=reason, failure=failure,
                        dead_letter=on_error == "dead-letter")

    def _failed(self, exc: BaseException, what: str, ctx: RecordContext | None,
                records: int) -> str:
        if isinstance(exc, GuestFailure):
            kind, message = exc.kind, exc.message
        elif isinstance(exc, AbiError):
            kind, message = "invalid-output", str(exc)
        elif isinstance(exc, FilterLoadError):
            kind, message = "init", str(exc)
        else:
            kind, message = "internal", f"{type(exc).__name__}: {exc}"
        topic = ctx.topic if ctx else None
        partition = ctx.partition if ctx else None
        # The exception itself for a bug of ours: the warning may be applied after this
        # handler is left (filters/effects.py), where exc_info=True would find nothing.
        exc_info: BaseException | bool = exc if kind == "internal" else False

        def counted() -> None:
            with self._counts:
                self.failures[kind] += 1
            self.repeats.warning(self._log, ("filter_failure", what, kind, topic),
                                 "filter_failure", call=what, kind=kind, reason=message[:200],
                                 policy=self.spec.on_error, records=records, topic=topic,
                                 partition=partition, exc_info=exc_info)

        effect(counted)
        return f"{kind}: {message}"

    def run_batch(self, ctx: RecordContext, records: Sequence[RecordLike], *,
                  offset_base: int = 0, timestamp_base: int = 0,
                  apply_policy: bool = True) -> BatchResult:
        """Run the filter over one batch: one Decision per record, in order.

        Offsets/timestamps given to the guest are ``offset_base + offset_delta`` and
        ``timestamp_base + timestamp_delta``. With `apply_policy` False, failed records come
        back as REJECT decisions whose `failure` is set, whatever ``on_error`` says (for tools
        that want to show what happened).
        """
        if not records:
            return BatchResult([])
        started = time.perf_counter_ns()
        failure: str | None = None
        remembered = getattr(self._native_failure, "last", None)
        self._native_failure.last = None
        decisions: list[Decision] = []
        detectors: dict[str, int] = {}
        if remembered is not None and remembered[0] == (
            id(ctx), offset_base, timestamp_base, len(records)
        ):
            # The native call on this batch already failed: its failure, taken as is. Not
            # raised again: a frame holding the exception it raises is a reference cycle.
            failure = self._failed(remembered[1], "filter", ctx, len(records))
        else:
            with self._instance(ctx.direction) as instance:
                try:
                    decisions, detectors = instance.run(ctx, records, offset_base,
                                                        timestamp_base)
                except PartitionError as exc:
                    self._partition_error(exc, ctx, len(records))
                    raise
                except Exception as exc:
                    # GuestFailure, a failed re-initialisation, or a bug of ours: a trapped
                    # instance is already marked dead; anything unexpected drops it too.
                    if not isinstance(exc, GuestFailure):
                        instance.discard()
                    failure = self._failed(exc, "filter", ctx, len(records))
        if failure is not None:
            decisions = [Decision(Action.REJECT, reason=failure, failure=failure)] * len(records)
            detectors = {}
        failed = 0
        for i, d in enumerate(decisions):
            if d.failure is None:
                continue
            failed += 1
            if failure is None:
                # A per-record failure (in-place and Connect ABIs): count and log it here.
                effect(partial(self._record_failure, ctx, d.failure, i))
            if apply_policy:
                decisions[i] = self._policy(d.failure)
        return BatchResult(decisions, detectors, failure, failed,
                           time.perf_counter_ns() - started)

    def run_admin(self, resource: AdminResource) -> AdminVerdict:
        """Offer one admin resource to the filter; failures follow ``on_error`` (``pass``
        allows unchanged; ``reject`` and ``dead-letter`` deny)."""
        with self._instance() as instance:
            try:
                verdict = decode_admin_output(instance.admin(resource.to_json()))
            except Exception as exc:
                if not isinstance(exc, GuestFailure):
                    instance.discard()
                failure = self._failed(exc, "admin", None, 1)
                if self.spec.on_error == "pass":
                    return AdminVerdict("allow", filter=self.name, failure=failure)
                return AdminVerdict("deny", message=f"filter {self.name} failed: {failure}",
                                    filter=self.name, failure=failure)
        return AdminVerdict(verdict.decision, verdict.message, verdict.partitions,
                            verdict.configs, filter=self.name)

    def close(self) -> None:
        with self._lock, self._pool:
            for runner in self._made:
                runner.close()

    def __repr__(self) -> str:
        return (f"LoadedFilter(name={self.name!r}, abi={self.abi!r}, "
                f"sha256={self.sha256[:12]}..., origin={self.origin!r})")
