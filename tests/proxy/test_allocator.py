"""proxy/ops/allocator.py: with glibc's thresholds raised, filtering batch-sized records
sections through builtin:encrypt no longer page-faults on every fresh buffer (each fault costs
CPU on the data path). Measured in two fresh processes, one tuned, one not, by their minor
page faults over the same 60 batches of 1 000 records."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from sluice.proxy.ops import allocator

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")

SCRIPT = textwrap.dedent('''
    import resource, sys, tempfile
    from pathlib import Path
    if sys.argv[1] == "tuned":
        from sluice.proxy.ops import allocator
        assert allocator.tune()
    from sluice.codec.records import BatchHeader, Record, build_batch
    from sluice.crypto.kms import KmsSettings
    from sluice.filters.chain import FilterChain
    from sluice.filters.config import FilterSpec
    from sluice.filters.context import RecordContext
    from sluice.filters.pipeline import filter_fetch, filter_produce
    recs = [Record(i, i, b"key-%d" % i, b'{"card": "4111-%06d", "pad": "%s"}' % (i, b"x" * 160),
                   [], 0) for i in range(1000)]
    data = build_batch(BatchHeader(0, 0, 0, 2, 0, 0, 999, 0, 999, -1, -1, -1, 1000), recs)
    with tempfile.TemporaryDirectory() as tmp:
        kms = KmsSettings("local", path=str(Path(tmp) / "keys.json"))
        chain = FilterChain.from_specs([FilterSpec(
            name="enc", module="builtin:encrypt", topics=("t",),
            apply_to=frozenset({"produce", "fetch"}), kms=kms,
            config={"key": "k", "decrypt_for": ["User:r"]})])
        produce = RecordContext("t", 0, "produce")
        fetch = RecordContext("t", 0, "fetch", principal="User:r")
        stored = bytes(filter_produce(chain, produce, data).records)
        assert bytes(filter_fetch(chain, fetch, stored).records) == data
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(30):
            filter_produce(chain, produce, data)
            filter_fetch(chain, fetch, stored)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
''')


def faults(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                         timeout=120, env=env, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def test_batch_sized_buffers_stop_page_faulting() -> None:
    untuned, tuned = faults("untuned"), faults("tuned")
    # 2 x 30 batches of about 250 KB each way: glibc's defaults fault thousands of pages in.
    assert untuned > 2000
    assert tuned < untuned / 10


def test_tune_leaves_the_operators_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []

    class Mallopt:
        argtypes: object = None
        restype: object = None

        def __call__(self, param: int, value: int) -> int:
            calls.append((param, value))
            return 1

    class Libc:
        mallopt = Mallopt()
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda _name: Libc())
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    assert allocator.tune()
    assert calls == [(allocator.M_TRIM_THRESHOLD, allocator.TRIM_THRESHOLD)]
