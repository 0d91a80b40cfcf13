"""A JavaScript admin filter in a real proxy: the topic policy that docs/WRITING_FILTERS.md
prints for the JavaScript SDK, built as written and bound to `admin` in `sluice serve` in front
of Tansu, refuses a CreateTopics item whose config breaks it (POLICY_VIOLATION with the
filter's message, for that item only), lets a good one through and caps another's partitions,
as builtin:topic-policy (C) does in tests/filters/builtin/test_builtins_proxy.py."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from sluice.filters.build import build_filter
from tests.harness.broker import TansuBroker
from tests.harness.kafka_admin import create_topics
from tests.harness.proxy import SluiceProxy

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "WRITING_FILTERS.md"
QUIET = {"log_level": 3}




def test_the_guides_javascript_topic_policy_in_a_proxy(
        tmp_path: Path, start_proxy: Callable[..., SluiceProxy], broker: TansuBroker) -> None:
    (code,) = [b for b in re.findall(r"```js\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)
               if "onAdmin(" in b]
    src = tmp_path / "policy"
    src.mkdir()
    (src / "filter.js").write_text(code)
    module = build_filter(src, src / "policy.wasm")
    cfg = tmp_path / "sluice.yaml"
    cfg.write_text(json.dumps({"filters": [{"name": "policy", "module": str(module),
                                            "topics": ["*"], "apply_to": ["admin"]}]}))
    proxy = start_proxy(config=cfg)

    tag = uuid.uuid4().hex[:8]
    good, short, unset, big = (f"good-{tag}", f"short-{tag}", f"unset-{tag}", f"big-{tag}")
    result = create_topics(proxy.bootstrap, [
        NewTopic(good, 2, 1, config={"retention.ms": "7200000"}),
        NewTopic(short, 1, 1, config={"retention.ms": "1000"}),
        NewTopic(unset, 1, 1),
        NewTopic(big, 50, 1, config={"retention.ms": "7200000"}),
    ])
    assert result[good] is None and result[big] is None
    assert result[short] == ("POLICY_VIOLATION: retention.ms must be at least 3600000 "
                             "(one hour), not 1000")
    assert (result[unset] or "").startswith("POLICY_VIOLATION")
    assert "not unset" in (result[unset] or "")
    md = AdminClient({"bootstrap.servers": broker.bootstrap, **QUIET}).list_topics(timeout=10)
    assert good in md.topics and big in md.topics
    assert short not in md.topics and unset not in md.topics
    assert len(md.topics[good].partitions) == 2
    assert len(md.topics[big].partitions) == 12  # the filter's rewrite
