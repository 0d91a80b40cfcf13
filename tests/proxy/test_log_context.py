"""Logs carry connection and filter context, and never record payloads."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import wasmtime
import yaml

from tests.e2e.clients import confluent_produce, create_topic, unique
from tests.harness.proxy import SluiceProxy
from tests.proxy.proxy_output import wait_for_output

MODULES = Path(__file__).resolve().parents[1] / "filters" / "modules"


def test_filter_failure_log_names_connection_and_filter(
    start_proxy: Callable[..., SluiceProxy], tmp_path: Path
) -> None:
    module = tmp_path / "oob_output.wasm"
    module.write_bytes(wasmtime.wat2wasm((MODULES / "oob_output.wat").read_text()))
    config = tmp_path / "sluice.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "filters": [
                    {
                        "name": "broken",
                        "module": str(module),
                        "topics": ["ctx-*"],
                        "apply_to": ["produce"],
                        "on_error": "pass",
                    }
                ]
            }
        )
    )
    proxy = start_proxy(config=config)
    topic = unique("ctx")
    create_topic(proxy.bootstrap, topic)
    secret = b"payload-4111111111111111-never-logged"
    confluent_produce(proxy.bootstrap, topic, [(b"key-never-logged", secret)])
    assert wait_for_output(proxy, '"filter_failure"')
    failures = [json.loads(line) for line in proxy.output if '"filter_failure"' in line]
    assert failures
    for event in failures:
        assert event["filter"] == "broken" and event["topic"] == topic
        assert isinstance(event["conn"], int) and event["client"].startswith("127.0.0.1:")
    output = "".join(proxy.output)
    assert secret.decode() not in output and "key-never-logged" not in output
