"""bench.scaling: its layouts and CPU planning, the sizing arithmetic, its usage errors, and a
`--quick` run against the bundled broker and real `sluice serve` processes pinned to CPUs.
No timing is asserted: only that every point was measured, pinned and reported."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest

from bench import scaling, scaling_plan, sizing
from bench.scaling_plan import LAYOUTS, CpuPlan, PlanError
from proxy.ops.config import ProxyConfig
from proxy.ops.config_load import load_config_file


def test_layouts_are_parsed_in_order_with_the_basis_first() -> None:
    names = [lay.name for lay in scaling_plan.parse_layouts("2cpu-w2, 2cpu,2cpu-w2")]
    assert names == ["1cpu", "2cpu-w2", "2cpu"]
    assert [lay.name for lay in scaling_plan.parse_layouts("")] == ["1cpu"]
    with pytest.raises(PlanError, match="unknown layouts: 3cpu"):
        scaling_plan.parse_layouts("1cpu,3cpu")


def test_a_layout_becomes_the_arguments_and_config_sluice_serve_reads(tmp_path: Path) -> None:
    assert LAYOUTS["1cpu"].proxy_args() == [] and LAYOUTS["1cpu"].proxy_yaml() == ""
    assert LAYOUTS["2cpu-w2"].proxy_args() == ["--workers", "2"]
    default = ProxyConfig(listen=("127.0.0.1", 0), upstream=[("h", 1)])
    assert default.filter_threads == scaling_plan.DEFAULT_FILTER_THREADS
    for name, threads in (("1cpu-t0", 0), ("2cpu-t4", 4)):
        path = tmp_path / f"{name}.yaml"
        path.write_text(LAYOUTS[name].proxy_yaml())
        config = load_config_file(path, ProxyConfig(listen=("127.0.0.1", 0), upstream=[("h", 1)]))
        assert config.filter_threads == threads


def test_on_two_cpus_the_second_cpu_of_a_two_cpu_layout_is_shared() -> None:
    layouts = scaling_plan.parse_layouts("2cpu,2cpu-w2")
    plan = scaling_plan.plan({0, 1}, layouts)
    assert plan.rest == {0}
    assert plan.proxy == {"1cpu": {1}, "2cpu": {0, 1}, "2cpu-w2": {0, 1}}
    assert not plan.shares("1cpu") and plan.shares("2cpu")


def test_with_enough_cpus_the_proxy_gets_cpus_of_its_own() -> None:
    layouts = scaling_plan.parse_layouts("2cpu")
    plan = scaling_plan.plan({0, 1, 2, 3}, layouts, rest={0, 1})
    assert plan.proxy == {"1cpu": {2}, "2cpu": {2, 3}}
    assert not plan.shares("2cpu")
    # The clients' CPUs are not necessarily the lowest.
    assert scaling_plan.plan({4, 5, 6}, layouts, rest={6}).proxy["2cpu"] == {4, 5}


@pytest.mark.parametrize(
    ("allowed", "rest", "message"),
    [
        ({3}, None, "needs at least 2 CPUs, one of them for the proxy alone; this process may "
                    "use 1 \\(3\\)"),
        ({0, 1}, {0, 1}, "takes every CPU"),
        ({0, 1}, {2}, "CPU 2 is not one this process may use"),
    ],
)
def test_cpu_sets_that_cannot_work_are_refused(
    allowed: set[int], rest: set[int] | None, message: str
) -> None:
    with pytest.raises(PlanError, match=message):
        scaling_plan.plan(allowed, scaling_plan.parse_layouts(""), rest)


def test_a_layout_wider_than_the_machine_is_refused() -> None:
    wide = scaling_plan.Layout("3cpu", 3)
    with pytest.raises(PlanError, match="layout 3cpu needs 3 CPUs"):
        scaling_plan.plan({0, 1}, [LAYOUTS["1cpu"], wide])


def test_cpu_sets_are_written_as_taskset_writes_them() -> None:
    assert CpuPlan.text({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert CpuPlan.text({1}) == "1"
    assert CpuPlan.text(set()) == ""


def test_sizing_arithmetic() -> None:
    assert sizing.cpu_s_per_gb(1.5, 3e9) == pytest.approx(0.5)
    assert math.isnan(sizing.cpu_s_per_gb(1.0, 0))
    assert sizing.cores_busy(3.0, 2.0) == pytest.approx(1.5)
    assert sizing.cores_per_gb_s(4.2) == 4.2
    costs = {"pass": 0.5, "mask": 5.0}
    # 2 GB/s passing through and 0.1 GB/s masked: 1.0 + 0.5 cores busy, 3 cores at 70 %.
    need = sizing.cores_needed({"pass": 2.0, "mask": 0.1}, costs)
    assert need.busy == pytest.approx(1.5) and need.cores == 3
    # Exactly at the limit is enough; nothing at all still gets one core.
    assert sizing.cores_needed({"pass": 1.4}, costs).cores == 1
    assert sizing.cores_needed({"pass": 1.4}, costs, utilisation=1.0).cores == 1
    assert sizing.cores_needed({"pass": 0.0, "other": 0.0}, costs).cores == 1
    with pytest.raises(ValueError, match="other: no measured CPU s/GB"):
        sizing.cores_needed({"other": 1.0}, costs)
    with pytest.raises(ValueError, match="utilisation"):
        sizing.cores_needed({"pass": 1.0}, costs, utilisation=0)
    with pytest.raises(ValueError, match="a rate of -1"):
        sizing.cores_needed({"pass": -1.0}, costs)
    # Every kind of traffic is measured in a variant and phase bench.scaling runs.
    assert {v for _, v, _ in sizing.KINDS} == set(scaling.VARIANTS)
    assert {p for _, _, p in sizing.KINDS} == set(scaling.PHASES)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--variants", "sluice,relay"], "--variants 'sluice,relay': expected names among"),
        (["--layouts", "8cpu"], "unknown layouts: 8cpu"),
        (["--cpus-rest", "x"], "expected CPU numbers"),
        (["--slices", "0"], "--slices and --records must be at least 1"),
    ],
)
def test_bad_arguments_are_refused_with_a_usage_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        scaling.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_one_cpu_is_refused_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(own)})
    try:
        with pytest.raises(SystemExit) as exit_info:
            scaling.main(["--quick"])
    finally:
        os.sched_setaffinity(0, own)
    assert exit_info.value.code == 2
    assert "needs at least 2 CPUs" in capsys.readouterr().err


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_quick_run_measures_and_pins_every_point(capsys: pytest.CaptureFixture[str]) -> None:
    own = os.sched_getaffinity(0)
    assert scaling.main(["--variants", "sluice", "--layouts", "1cpu,2cpu", "--quick"]) == 0
    assert os.sched_getaffinity(0) == own  # the test process gets its CPUs back
    out = capsys.readouterr().out
    assert "every proxy thread" in out and "load average" in out
    busy = re.search(r"CPU 0 (\d+)%, CPU 1 (\d+)%", out)
    assert busy is not None and all(0 <= int(b) <= 100 for b in busy.groups())
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
        for line in out.splitlines()
        if line.startswith("| direct |") or line.startswith("| sluice/")
    }
    assert set(rows) == {"direct", "sluice/1cpu", "sluice/2cpu"}
    for name, cells in rows.items():
        # produce and consume records/s measured for every point
        assert float(cells[2].split()[0]) > 0 and float(cells[7].split()[0]) > 0
        if name != "direct":
            assert cells[3] != "-" and cells[8] != "-"  # ratio to direct
    assert (rows["sluice/2cpu"][4] != "-") and rows["sluice/1cpu"][4] == "-"  # / 1cpu
    two = len(own) == 2
    assert ("(shared)" in rows["sluice/2cpu"][1]) is two
    assert ("NOTE: the proxy in 2cpu shares" in out) is two
    assert "| passing through, produce |" in out and "| passing through, fetch |" in out
