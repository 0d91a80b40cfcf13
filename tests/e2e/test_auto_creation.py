"""Topic auto-creation through the proxy behaves as against Apache Kafka directly.

Kafka (KRaft) answers the first Metadata request that may create an unknown topic with
UNKNOWN_TOPIC_OR_PARTITION and creates the topic meanwhile; the next answer lists it. The
proxy was once suspected of turning auto-creation off: these tests compare the two side by
side, with raw Metadata frames and with real producers (kafka-python, confluent-kafka). Under
an admin filter only the names it refuses are kept from being created.
"""

from __future__ import annotations

import time
from typing import Any

from tests.e2e.clients import confluent_produce, kafka_python_produce, unique
from tests.e2e.test_internal_topics import _policed, broker_topics, metadata
from tests.harness.proxy import SluiceProxy


def _created(broker: Any, names: set[str], timeout: float = 15) -> set[str]:
    deadline = time.monotonic() + timeout
    while True:
        found = names & broker_topics(broker)
        if found == names or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_auto_creating_metadata_answers_as_the_broker_does(
    broker: Any, shared_proxy: SluiceProxy
) -> None:
    direct_port = int(broker.bootstrap.rsplit(":", 1)[1])
    for version in (4, 9, 12):
        direct, proxied = unique(f"auto-direct-v{version}"), unique(f"auto-proxy-v{version}")
        answer = metadata(direct_port, [direct], version=version, auto_create=True)
        via = metadata(shared_proxy.port, [proxied], version=version, auto_create=True)
        assert int(via[proxied].error_code) == int(answer[direct].error_code)
        assert _created(broker, {direct, proxied}) == {direct, proxied}
        # Without the flag neither creates.
        off = unique(f"auto-off-v{version}")
        metadata(shared_proxy.port, [off], version=version, auto_create=False)
        assert off not in broker_topics(broker)


def test_producers_create_their_topic_through_the_proxy(
    broker: Any, shared_proxy: SluiceProxy
) -> None:
    for bootstrap in (broker.bootstrap, shared_proxy.bootstrap):
        topic = unique("auto-cf")
        assert confluent_produce(bootstrap, topic, [(None, b"x")]) == [(0, 0)]
        topic = unique("auto-kp")
        assert kafka_python_produce(bootstrap, topic, [(None, b"y")]) == 1
        assert topic in broker_topics(broker)


def test_a_refused_name_does_not_stop_an_allowed_one_being_created(
    broker: Any, tmp_path_factory: Any
) -> None:
    """Under an admin filter, a Metadata request naming a new topic the filter allows and one
    it refuses creates the first (as Kafka directly creates both) and not the second, which
    is answered UNKNOWN_TOPIC_OR_PARTITION. It once turned auto-creation off for both."""
    with _policed(broker.bootstrap, tmp_path_factory) as policed:
        allowed, forbidden = unique("mixed-fine"), unique("Mixed_Not_Allowed")
        answer = metadata(policed.port, [allowed, forbidden], version=9, auto_create=True)
        assert int(answer[forbidden].error_code) == 3  # UNKNOWN_TOPIC_OR_PARTITION
        assert allowed in answer
        assert _created(broker, {allowed}) == {allowed}
        assert forbidden not in broker_topics(broker)
        # A refused name that exists is answered as it is, beside a new allowed one.
        existing, other = unique("Existing_Upper"), unique("mixed-new")
        direct_port = int(broker.bootstrap.rsplit(":", 1)[1])
        metadata(direct_port, [existing], version=9, auto_create=True)
        assert _created(broker, {existing}) == {existing}
        answer = metadata(policed.port, [existing, other], version=9, auto_create=True)
        assert int(answer[existing].error_code) == 0
        assert _created(broker, {other}) == {other}
