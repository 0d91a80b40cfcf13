"""Fixtures for the shipped filters: their committed modules, loaded through the test host."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.filters.sdk.guest_abi import Guest

BUILTIN = Path(__file__).resolve().parents[3] / "filters" / "builtin"


@pytest.fixture
def load_builtin() -> Callable[..., Guest]:
    def load(name: str, config: dict[str, Any] | None = None) -> Guest:
        return Guest(BUILTIN / f"{name}.wasm", {} if config is None else config)

    return load
