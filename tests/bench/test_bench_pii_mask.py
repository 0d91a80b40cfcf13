"""bench_pii_mask --against times two pii-mask builds in one process (no timing asserted)."""

from __future__ import annotations

import pytest

from bench import bench_pii_mask
from tests.filters.builtin.conftest import BUILTIN


def test_against_prints_both_builds_and_their_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    module = str(BUILTIN / "pii-mask.wasm")
    bench_pii_mask.main(["--records", "40", "--batch", "10", "--rounds", "1",
                         "--variants", "workload,clean,json-validate", "--module", module,
                         "--against", module])
    out = capsys.readouterr().out
    assert f"B = {module}" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()
            if line.startswith("pii-mask/") or line.startswith("json-validate")}
    assert set(rows) == {"pii-mask/workload", "pii-mask/clean"}  # only pii-mask builds compared
    for cells in rows.values():
        a_us, a_ns, b_us, b_ns, ratio = (float(c) for c in cells)
        assert a_us > 0 and b_us > 0 and a_ns > 0 and b_ns > 0
        assert ratio == pytest.approx(a_us / b_us, abs=0.01)
