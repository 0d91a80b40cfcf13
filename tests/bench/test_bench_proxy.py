"""The proxy benchmark's harness: its pair statistics, and a `--quick` run of every variant
against the real broker, HAProxy and `sluice serve`. No timing is asserted: only that every
variant was measured in every slice and reported."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from bench import baseline, bench_proxy, cpu_clock, pairs, rig, targets
from tests.harness.broker import TansuBroker


def test_pairs_take_the_median_of_per_slice_ratios_and_skip_missing_slices() -> None:
    values = [110.0, None, 90.0, 200.0]
    reference = [100.0, 100.0, 100.0, 100.0]
    r = pairs.ratios(values, reference)
    assert r == [1.1, 0.9, 2.0]
    s = pairs.summarise(r)
    assert (s.median, s.low, s.high, s.n) == (1.1, 0.9, 2.0, 3)
    assert s.ratio_text() == "1.10 (0.90..2.00)"
    assert pairs.differences([3.0, 1.0], [1.0, 2.0]) == [2.0, -1.0]
    assert pairs.summarise([]).ratio_text() == "-"
    assert math.isnan(pairs.median([None]))


def test_rotation_moves_every_variant_through_every_position() -> None:
    names = ["a", "b", "c"]
    orders = [pairs.rotation(names, s) for s in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    for position in range(3):
        assert {o[position] for o in orders} == set(names)


def test_every_round_of_reads_holds_every_variant_once_and_moves_each_along() -> None:
    names = ["direct", "aa", "sluice"]
    rounds = bench_proxy.read_rounds(names, slice_index=1, reads=3)
    assert rounds[0] == pairs.rotation(names, 1)  # the first round reads in the slice's order
    assert all(sorted(r) == sorted(names) for r in rounds)
    for position in range(3):  # no variant always reads at the same moment of the slice
        assert {r[position] for r in rounds} == set(names)
    assert bench_proxy.read_rounds(names, 0, 1) == [names]


def test_a_slice_takes_its_consume_speed_over_all_reads_and_its_cpu_per_one_read() -> None:
    cpu = cpu_clock.CpuTimes
    produced = bench_proxy.Call(1000, 0.5, cpu(0.2, 0.2), 0.001)
    reads = [
        bench_proxy.Call(1000, 0.25, cpu(0.1, 0.1), 0.002, first=0.05),
        bench_proxy.Call(1000, 0.75, cpu(0.3, 0.3), 0.002, first=0.10),
        bench_proxy.Call(1000, 0.5, cpu(0.2, 0.2), 0.002, first=0.30),
    ]
    payload = 100_000_000  # 0.2 GB both ways
    sl = bench_proxy.combine(produced, reads, payload, middle=True)
    assert sl.produce == 2000
    assert sl.consume == 2000  # 3 000 records in 1.5 s, not the mean of the reads' speeds
    assert sl.first == 0.10
    # One produce (0.2 s) and the mean read (0.2 s) over 0.2 GB.
    assert sl.cpu_per_gb == pytest.approx(2.0) and sl.cpu_per_gb_ticks == pytest.approx(2.0)
    assert sl.client_produce == pytest.approx(1.0) and sl.client_consume == pytest.approx(2.0)
    # Each side per GB one way (0.1 GB): the produce's 0.2 s and the mean read's 0.2 s.
    assert sl.cpu_produce == pytest.approx(2.0) and sl.cpu_read == pytest.approx(2.0)
    skewed = bench_proxy.combine(produced, reads[:1], payload, middle=True)
    assert skewed.cpu_produce == pytest.approx(2.0) and skewed.cpu_read == pytest.approx(1.0)
    # One read is what a slice measured before reads were repeated: the same figure.
    one = bench_proxy.combine(produced, reads[2:], payload, middle=True)
    assert one.cpu_per_gb == pytest.approx(2.0) and one.consume == 2000
    unmeasured = bench_proxy.combine(produced, reads, payload, middle=False)
    assert unmeasured.cpu_per_gb is None and unmeasured.cpu_produce is None
    with pytest.raises(ValueError):
        bench_proxy.combine(produced, [], payload, middle=True)


def test_bad_arguments_are_refused_with_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--variants", "direct,nope"], ["--workload", "4"], ["--workload", "x"],
                 ["--reads", "0"]):
        with pytest.raises(SystemExit) as exc:
            bench_proxy.main(argv)
        assert exc.value.code == 2
    assert "nope" in capsys.readouterr().err


def test_a_baseline_that_is_not_a_source_tree_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_proxy.main(["--workload", "1", "--variants", "sluice", "--baseline",
                          str(tmp_path)])
    assert exc.value.code == 2
    assert "not a Sluice source tree" in capsys.readouterr().err


def test_a_baseline_tree_is_what_its_processes_import(tmp_path: Path) -> None:
    """bench/baseline.py: a process started with the Source imports the given tree, not this
    checkout's editable install (a copy of this checkout's Python here, without native
    modules: prepare builds them into the copy)."""
    root = Path(__file__).resolve().parents[2]
    tree = tmp_path / "tree"
    for entry in ("sluice", *baseline.ROOMS):
        shutil.copytree(root / entry, tree / entry,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    source = baseline.prepare(tree)
    assert list((tree / "crypto").glob("_batch_seal*.so")), "the tree's sealer was built"
    assert list((tree / "filters").glob("_epoch_ticker*.so")), "and its epoch ticker"
    # A tree from before a native module existed is prepared without it.
    older = tmp_path / "older"
    shutil.copytree(tree, older, ignore=shutil.ignore_patterns("_epoch_ticker*.so"))
    (older / "filters" / "epoch_ticker_build.py").unlink()
    baseline.prepare(older)
    assert not list((older / "filters").glob("_epoch_ticker*.so"))
    out = subprocess.run(
        [sys.executable, "-c", "import sluice.crypto.batch_seal as m; print(m.__file__)"],
        cwd=source.cwd, env=dict(os.environ, **source.env), capture_output=True, text=True,
        check=True)
    assert Path(out.stdout.strip()).resolve().is_relative_to(tree.resolve())


@pytest.mark.skipif(not targets.haproxy_available(), reason="haproxy not installed")
def test_quick_run_measures_every_variant_in_every_slice(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench_proxy.main(["--workload", "1,3", "--quick"]) == 0
    out = capsys.readouterr().out
    tables = out.split("workload 3:")
    assert len(tables) == 2
    throughput, latency = tables
    for name in rig.ALL:
        row = next(line for line in throughput.splitlines() if line.startswith(f"| {name} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        # produce rec/s, its ratio, consume rec/s, its ratio: measured in both slices.
        assert float(cells[1]) > 0 and float(cells[3]) > 0
        assert "(" in cells[2] and "(" in cells[4]
        middle = name not in ("direct", "aa")
        assert (cells[5] != "-") is middle
        assert all(float(x) > 0 for x in cells[6].split(" / "))  # the client's CPU per record
    assert "Direct speed" in throughput and "sluice / relay" in throughput
    for name in [n for n in rig.ALL if n != "aa"]:
        row = next(line for line in latency.splitlines() if line.startswith(f"| {name} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1]) > 0 and float(cells[2]) >= float(cells[1])
        assert (cells[7] != "-") is (name != "direct")
        # Run-queue wait per request: measured for every process in the middle.
        assert (cells[8] != "-") is (name != "direct")
        assert name == "direct" or float(cells[8]) >= 0


def test_workers_and_proxy_arguments_reach_sluice_serve_and_cpu_counts_every_worker() -> None:
    with (
        TansuBroker() as broker,
        targets.sluice(broker.bootstrap, args=["--workers", "2", "--log-level=info"]) as t,
    ):
        assert t.pid is not None
        parent = psutil.Process(t.pid)
        assert "--workers" in parent.cmdline() and "--log-level=info" in parent.cmdline()
        assert len(parent.children(recursive=True)) == 2
        own = parent.cpu_times()
        assert targets.cpu_seconds(t.pid) >= own.user + own.system


def test_cpu_lists_are_parsed_as_taskset_writes_them_and_checked() -> None:
    allowed = os.sched_getaffinity(0)
    first = min(allowed)
    assert targets.parse_cpus(str(first)) == {first}
    assert targets.parse_cpus(f"{first}-{first}") == {first}
    for bad in ("x", "1-", "", f"{max(allowed) + 1}"):
        with pytest.raises(ValueError):
            targets.parse_cpus(bad)


def test_pin_restricts_every_thread_of_the_process_and_its_children() -> None:
    cpu = {min(os.sched_getaffinity(0))}
    code = (
        "import subprocess, sys, threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "print('up', flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        assert targets.pin(proc.pid, cpu) >= 3  # main thread, the extra thread, the child
        parent = psutil.Process(proc.pid)
        for p in (parent, *parent.children(recursive=True)):
            for t in p.threads():
                assert os.sched_getaffinity(t.id) == cpu
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()
