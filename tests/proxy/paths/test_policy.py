"""Data policies (``x-data-policy``) on their own: value validation, the splitting of
(Incremental)AlterConfigs requests and the merging of answers in request order, DescribeConfigs,
the fleet records and the bindings. Real frames built by the codec, no sockets."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from sluice.codec import entities, schemas
from sluice.codec.error_codes import ErrorCode
from sluice.codec.headers import request_header_bytes, response_header_bytes
from sluice.codec.messages import (
    ApiKey,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from sluice.filters.abi_base import FilterLoadError
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext
from sluice.filters.pipeline import filter_fetch, filter_produce
from sluice.filters.runtime import load_filter
from sluice.proxy.ops.fleet import FleetView
from sluice.proxy.ops.policies import (
    AdminMatcher,
    Policy,
    PolicyError,
    parse_policy,
    parse_policy_admins,
    parse_policy_record,
    policy_bindings,
    policy_record_value,
)
from sluice.proxy.paths.admin import AdminPath
from sluice.proxy.paths.base import Answer, Defer, Forward, Respond
from sluice.proxy.paths.policy import PolicyDescribePath
from tests.filters.test_native_path import make_batch
from tests.proxy.paths.test_paths import Letters, ListSink, context, exchange_of, perform

PII = '{"filters":[{"name":"pii","apply_to":["produce"],"config":{"mask":"#"}}]}'
PII_FETCH = '{"filters":[{"name":"pii","apply_to":"fetch"}]}'
ADMIN = "User:ops-ann"


@dataclass
class Book:
    """An in-memory policy book: the fleet is a dict, `deployed` the fleet's filter names."""

    admins: tuple[str, ...] = ("User:ops-*",)
    deployed: tuple[str, ...] = ("pii",)
    policies: dict[str, str] = field(default_factory=dict)
    written: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    fail_publish: bool = False

    def allows(self, principal: str | None) -> bool:
        return AdminMatcher(self.admins).allows(principal)

    def value(self, topic: str) -> str | None:
        return self.policies.get(topic)

    def check(self, topic: str, policy: Policy) -> PolicyError | None:
        for i, f in enumerate(policy.filters):
            if f.name not in self.deployed:
                return PolicyError(f"filters[{i}].name", f"filter {f.name!r} is not deployed")
        return None

    async def publish(self, topic: str, value: str | None, principal: str | None) -> None:
        if self.fail_publish:
            raise OSError("fleet cluster unreachable")
        self.written.append((topic, value, principal))
        if value is None:
            self.policies.pop(topic, None)
        else:
            self.policies[topic] = value


def ctx_with(book: Book, sink: ListSink | None = None) -> Any:
    ctx = context(None, sink or ListSink(), Letters())
    ctx.policies = book
    return ctx


def settle(outcome: Any) -> Any:
    """Run deferred jobs as the connection would (network jobs on an event loop)."""
    while isinstance(outcome, Defer):
        job = outcome.job
        result = job.run() if job.in_thread else asyncio.run(job.run())
        outcome = job.finish(result)
    return outcome


def incremental(resources: list[tuple[str, list[tuple[str, int, str | None]]]],
                version: int = 1, validate_only: bool = False) -> bytes:
    cls = schemas.request_schema(ApiKey.INCREMENTAL_ALTER_CONFIGS, version)
    rcls = entities.element_class(cls, "resources")
    ccls = entities.element_class(rcls, "configs")
    request = entities.build(cls, validate_only=validate_only, resources=tuple(
        entities.build(rcls, resource_type=2, resource_name=name, configs=tuple(
            entities.build(ccls, name=k, config_operation=op, value=v) for k, op, v in configs))
        for name, configs in resources))
    return (request_header_bytes(ApiKey.INCREMENTAL_ALTER_CONFIGS, version, 7, "admin")
            + encode_request(request))


def alter(resources: list[tuple[str, list[tuple[str, str]]]], version: int = 1) -> bytes:
    cls = schemas.request_schema(ApiKey.ALTER_CONFIGS, version)
    rcls = entities.element_class(cls, "resources")
    ccls = entities.element_class(rcls, "configs")
    request = entities.build(cls, validate_only=False, resources=tuple(
        entities.build(rcls, resource_type=2, resource_name=name, configs=tuple(
            entities.build(ccls, name=k, value=v) for k, v in configs))
        for name, configs in resources))
    return request_header_bytes(ApiKey.ALTER_CONFIGS, version, 7, "admin") + encode_request(request)


def sent_request(api: ApiKey, version: int, frame: bytes, outcome: Forward) -> Any:
    body = outcome.frame if outcome.frame is not None else frame
    header = exchange_of(bytes(body)).header
    return decode_request(api, version, bytes(body)[header.header_size:])


def broker_answer(api: ApiKey, version: int, names_codes: list[tuple[str, int]]) -> bytes:
    cls = entities.response_class(api, version)
    rcls = entities.element_class(cls, "responses")
    response = entities.build(cls, responses=tuple(
        entities.build(rcls, error_code=code, error_message=None, resource_type=2,
                       resource_name=name) for name, code in names_codes))
    return response_header_bytes(7, api, version) + encode_response(response)


def results_of(api: ApiKey, version: int, frame: bytes | memoryview) -> list[tuple[str, int, Any]]:
    size = len(response_header_bytes(7, api, version))
    response = decode_response(api, version, bytes(frame)[size:])
    return [(str(r.resource_name), int(r.error_code), r.error_message) for r in response.responses]


# ------------------------------------------------------------------ the value


def test_a_valid_policy_parses() -> None:
    policy = parse_policy('{"filters":[{"name":"pii","apply_to":"fetch"},'
                          '{"name":"b","apply_to":["produce","fetch"],"config":{"x":1}}]}')
    assert [(f.name, f.apply_to, dict(f.config)) for f in policy.filters] == [
        ("pii", ("fetch",), {}), ("b", ("fetch", "produce"), {"x": 1})]


def test_one_filter_as_an_object_is_what_kafka_configs_sends() -> None:
    """kafka-configs.sh --add-config removes every square bracket of the value: the docs'
    one-filter policy arrives with `filters` an object, read as a list of one."""
    documented = '{"filters":[{"name":"pii","apply_to":"produce","config":{"mask":"#"}}]}'
    stripped = documented.replace("[", "").replace("]", "")
    assert parse_policy(stripped) == parse_policy(documented)


@pytest.mark.parametrize(("value", "message"), [
    ("{not json", "x-data-policy: not JSON"),
    ("[]", "x-data-policy: must be a JSON object"),
    ('{"filters":[]}', "x-data-policy: filters: must name 1 to 16 filters"),
    ('{"rules":[]}', "x-data-policy: rules: unknown field"),
    ('{"filters":[{"name":"pii"}]}', "x-data-policy: filters[0].apply_to: required"),
    ('{"filters":[{"name":"pii","apply_to":"prodcue"}]}',
     'x-data-policy: filters[0].apply_to: expected "produce" or "fetch", got "prodcue"'),
    ('{"filters":[{"name":"pii","apply_to":["fetch","admin"]}]}',
     'x-data-policy: filters[0].apply_to[1]: expected "produce" or "fetch", got "admin"'),
    ('{"filters":[{"name":"a","apply_to":"fetch"},{"name":"a","apply_to":"fetch"}]}',
     "x-data-policy: filters[1].name: filter 'a' is named twice"),
    ('{"filters":[{"name":"pii","apply_to":"fetch","config":[1]}]}',
     "x-data-policy: filters[0].config: must be an object"),
    ('{"filters":[{"name":"pii","apply_to":"fetch","mode":1}]}',
     "x-data-policy: filters[0].mode: unknown field"),
    ('{"filters":[{"apply_to":"fetch"}]}', "x-data-policy: filters[0].name: required"),
])
def test_malformed_values_name_the_field(value: str, message: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(value)
    assert str(err.value).startswith(message), str(err.value)


def test_policy_admins_section() -> None:
    assert parse_policy_admins(None) is None
    assert parse_policy_admins(["User:ops-*"]) == ("User:ops-*",)
    with pytest.raises(ValueError, match="policy_admins"):
        parse_policy_admins({"a": 1})
    assert not AdminMatcher(None).allows("User:ANONYMOUS")
    assert AdminMatcher(["User:ANONYMOUS"]).allows(None)
    assert AdminMatcher(["User:ops-*"]).allows("User:ops-ann")
    assert not AdminMatcher(["User:ops-*"]).allows("User:dev-bob")


# ------------------------------------------------------------------ IncrementalAlterConfigs


@pytest.mark.parametrize("version", [0, 1])
def test_policy_is_split_out_and_the_rest_reaches_the_broker(version: int) -> None:
    book, sink = Book(), ListSink()
    ctx = ctx_with(book, sink)
    api = ApiKey.INCREMENTAL_ALTER_CONFIGS
    frame = incremental([("plain", [("retention.ms", 0, "1000")]),
                         ("orders", [("x-data-policy", 0, PII), ("retention.ms", 0, "2000")]),
                         ("only", [("x-data-policy", 0, PII)])], version)
    outcome = settle(AdminPath().on_request(ctx, exchange_of(frame, ADMIN), frame))
    assert isinstance(outcome, Forward) and outcome.frame is not None
    sent = sent_request(api, version, frame, outcome)
    assert [(r.resource_name, [(c.name, c.value) for c in r.configs]) for r in sent.resources] == [
        ("plain", [("retention.ms", "1000")]), ("orders", [("retention.ms", "2000")])]
    assert book.written == []  # nothing stored before the broker accepted the other keys
    exchange = exchange_of(frame, ADMIN)
    exchange.state = outcome.state
    response = settle(AdminPath().on_response(
        ctx, exchange, broker_answer(api, version, [("plain", 0), ("orders", 0)])))
    assert isinstance(response, Respond)
    assert [r[:2] for r in results_of(api, version, response.frame)] == [
        ("plain", 0), ("orders", 0), ("only", 0)]
    assert book.written == [("orders", PII, ADMIN), ("only", PII, ADMIN)]
    perform(exchange, sink)
    assert [(e["op"], e["resource"], e["decision"]) for e in sink.events] == [
        ("set_policy", "orders", "allow"), ("set_policy", "only", "allow")]


def test_a_broker_refusal_keeps_the_policy_unset() -> None:
    book = Book()
    ctx = ctx_with(book)
    api = ApiKey.INCREMENTAL_ALTER_CONFIGS
    frame = incremental([("orders", [("x-data-policy", 0, PII), ("bogus.key", 0, "1")])])
    outcome = settle(AdminPath().on_request(ctx, exchange_of(frame, ADMIN), frame))
    exchange = exchange_of(frame, ADMIN)
    exchange.state = outcome.state
    response = settle(AdminPath().on_response(
        ctx, exchange, broker_answer(api, 1, [("orders", int(ErrorCode.INVALID_CONFIG))])))
    assert [r[:2] for r in results_of(api, 1, response.frame)] == [("orders", 40)]
    assert book.written == [] and book.policies == {}


def test_policy_only_request_is_answered_by_the_proxy() -> None:
    book = Book()
    frame = incremental([("orders", [("x-data-policy", 0, PII)])])
    outcome = settle(AdminPath().on_request(ctx_with(book), exchange_of(frame, ADMIN), frame))
    assert isinstance(outcome, Answer)
    assert results_of(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, outcome.response) == [
        ("orders", 0, None)]
    assert book.policies == {"orders": PII}
    # DELETE removes it
    frame = incremental([("orders", [("x-data-policy", 1, None)])])
    outcome = settle(AdminPath().on_request(ctx_with(book), exchange_of(frame, ADMIN), frame))
    assert isinstance(outcome, Answer) and book.policies == {}


def test_validate_only_checks_but_stores_nothing() -> None:
    book = Book()
    frame = incremental([("orders", [("x-data-policy", 0, PII)])], validate_only=True)
    outcome = settle(AdminPath().on_request(ctx_with(book), exchange_of(frame, ADMIN), frame))
    assert isinstance(outcome, Answer)
    assert results_of(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, outcome.response)[0][1] == 0
    assert book.written == []
    bad = incremental([("orders", [("x-data-policy", 0, "{")])], validate_only=True)
    outcome = settle(AdminPath().on_request(ctx_with(book), exchange_of(bad, ADMIN), bad))
    assert results_of(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, outcome.response)[0][1] == 40


@pytest.mark.parametrize(("configs", "principal", "code", "text"), [
    ([("x-data-policy", 0, PII_FETCH)], "User:dev-bob", 29, "may not set x-data-policy"),
    ([("x-data-policy", 0, PII_FETCH)], None, 29, "User:ANONYMOUS may not set"),
    ([("x-data-policy", 1, None)], "User:dev-bob", 29, "may not remove"),
    ([("x-data-policy", 0, '{"filters":[{"name":"pii","apply_to":"both"}]}')], ADMIN, 40,
     'x-data-policy: filters[0].apply_to: expected "produce" or "fetch"'),
    ([("x-data-policy", 0, '{"filters":[{"name":"nope","apply_to":"fetch"}]}')], ADMIN, 40,
     "x-data-policy: filters[0].name: filter 'nope' is not deployed"),
    ([("x-data-policy", 2, PII)], ADMIN, 40, "only SET and DELETE"),
    ([("x-data-policy", 0, PII_FETCH), ("x-data-policy", 0, PII)], ADMIN, 40, "more than once"),
])
def test_refused_changes_send_nothing_of_their_resource(
    configs: list[tuple[str, int, str | None]], principal: str | None, code: int, text: str
) -> None:
    book, sink = Book(policies={"orders": PII}), ListSink()
    api = ApiKey.INCREMENTAL_ALTER_CONFIGS
    frame = incremental([("orders", [*configs, ("retention.ms", 0, "5")]),
                         ("other", [("retention.ms", 0, "6")])])
    asked = exchange_of(frame, principal)
    outcome = settle(AdminPath().on_request(ctx_with(book, sink), asked, frame))
    perform(asked, sink)
    assert isinstance(outcome, Forward)
    sent = sent_request(api, 1, frame, outcome)
    assert [r.resource_name for r in sent.resources] == ["other"]
    exchange = exchange_of(frame, principal)
    exchange.state = outcome.state
    response = settle(AdminPath().on_response(ctx_with(book), exchange,
                                              broker_answer(api, 1, [("other", 0)])))
    (orders, other) = results_of(api, 1, response.frame)
    assert orders[:2] == ("orders", code) and text in orders[2], orders
    assert other == ("other", 0, None)
    assert book.written == [] and book.policies == {"orders": PII}
    if code == 29 or "apply_to" in text or "deployed" in text:
        assert [(e["resource"], e["decision"], e["error_code"]) for e in sink.events] == [
            ("orders", "deny", code)]


def test_requests_without_the_key_pass_as_their_bytes() -> None:
    frame = incremental([("orders", [("retention.ms", 0, "5")])])
    outcome = AdminPath().on_request(ctx_with(Book()), exchange_of(frame), frame)
    assert isinstance(outcome, Forward) and outcome.frame is None and outcome.state is None


def test_without_a_fleet_the_key_is_refused_never_passed_on() -> None:
    ctx = context(None, ListSink(), Letters())
    assert AdminPath().wants_request(ctx, ApiKey.INCREMENTAL_ALTER_CONFIGS)
    assert AdminPath().wants_request(ctx, ApiKey.CREATE_TOPICS)
    frame = incremental([("orders", [("X-Data-Policy", 0, PII)]),
                         ("plain", [("retention.ms", 0, "5")])])
    outcome = AdminPath().on_request(ctx, exchange_of(frame, ADMIN), frame)
    assert isinstance(outcome, Forward) and outcome.frame is not None
    api = ApiKey.INCREMENTAL_ALTER_CONFIGS
    sent = sent_request(api, 1, frame, outcome)
    assert [r.resource_name for r in sent.resources] == ["plain"]
    exchange = exchange_of(frame, ADMIN)
    exchange.state = outcome.state
    response = settle(AdminPath().on_response(ctx, exchange,
                                              broker_answer(api, 1, [("plain", 0)])))
    results = results_of(api, 1, response.frame)
    assert [r[:2] for r in results] == [("orders", 40), ("plain", 0)]
    assert "fleet" in results[0][2]
    # Without the key: untouched.
    frame = incremental([("plain", [("retention.ms", 0, "5")])])
    assert AdminPath().on_request(ctx, exchange_of(frame), frame) == Forward()


@pytest.mark.parametrize("spelling", ["X-Data-Policy", "X-DATA-POLICY", "x-Data-policy"])
def test_the_key_in_any_case_is_the_policy(spelling: str) -> None:
    book = Book()
    frame = incremental([("orders", [(spelling, 0, PII)])])
    outcome = settle(AdminPath().on_request(ctx_with(book), exchange_of(frame, ADMIN), frame))
    assert isinstance(outcome, Answer)
    assert book.policies == {"orders": PII}


@pytest.mark.parametrize("name", ["c*", "*", "a?b", "[ab]", ".", "..", "x" * 250, "a b", "é"])
def test_a_policy_names_exactly_one_topic(name: str) -> None:
    book = Book()
    frame = incremental([(name, [("x-data-policy", 0, PII)])])
    outcome = settle(AdminPath().on_request(ctx_with(book), exchange_of(frame, ADMIN), frame))
    assert isinstance(outcome, Answer)
    [(_name, code, message)] = results_of(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, outcome.response)
    assert code == ErrorCode.INVALID_CONFIG and "not a Kafka topic name" in message
    assert book.written == []


def test_create_topics_with_the_key_is_refused_for_that_topic_only() -> None:
    cls = schemas.request_schema(ApiKey.CREATE_TOPICS, 5)
    tcls = entities.element_class(cls, "topics")
    ccls = entities.element_class(tcls, "configs")
    request = entities.build(cls, timeout_ms=1000, validate_only=False, topics=(
        entities.build(tcls, name="with", num_partitions=1, replication_factor=1,
                       assignments=(), configs=(entities.build(ccls, name="X-Data-Policy",
                                                               value=PII),)),
        entities.build(tcls, name="without", num_partitions=1, replication_factor=1,
                       assignments=(), configs=())))
    frame = request_header_bytes(ApiKey.CREATE_TOPICS, 5, 7, "a") + encode_request(request)
    for ctx in (ctx_with(Book()), context(None, ListSink(), Letters())):
        outcome = AdminPath().on_request(ctx, exchange_of(frame, ADMIN), frame)
        assert isinstance(outcome, Forward) and outcome.frame is not None
        sent = sent_request(ApiKey.CREATE_TOPICS, 5, frame, outcome)
        assert [t.name for t in sent.topics] == ["without"]


def test_a_store_failure_fails_that_resource() -> None:
    book = Book(fail_publish=True)
    frame = incremental([("orders", [("x-data-policy", 0, PII)])])
    outcome = settle(AdminPath().on_request(ctx_with(book), exchange_of(frame, ADMIN), frame))
    [(_name, code, message)] = results_of(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, outcome.response)
    assert code == ErrorCode.UNKNOWN_SERVER_ERROR and "fleet topic" in message


# ------------------------------------------------------------------ AlterConfigs


@pytest.mark.parametrize("version", [0, 1, 2])
def test_alter_configs_sets_and_leaving_the_key_out_deletes(version: int) -> None:
    book = Book()
    api = ApiKey.ALTER_CONFIGS
    frame = alter([("orders", [("x-data-policy", PII)])], version)
    outcome = settle(AdminPath().on_request(ctx_with(book), exchange_of(frame, ADMIN), frame))
    assert isinstance(outcome, Answer)  # only the policy: the broker's configs stay as they are
    assert book.policies == {"orders": PII}
    frame = alter([("orders", [("retention.ms", "9")])], version)
    outcome = settle(AdminPath().on_request(ctx_with(book), exchange_of(frame, ADMIN), frame))
    assert isinstance(outcome, Forward) and outcome.frame is None  # sent as it is
    exchange = exchange_of(frame, ADMIN)
    exchange.state = outcome.state
    settle(AdminPath().on_response(ctx_with(book), exchange,
                                   broker_answer(api, version, [("orders", 0)])))
    assert book.policies == {} and book.written[-1] == ("orders", None, ADMIN)


def test_alter_configs_by_a_non_admin_may_not_drop_a_policy() -> None:
    book = Book(policies={"orders": PII})
    frame = alter([("orders", [("retention.ms", "9")])])
    outcome = settle(AdminPath().on_request(ctx_with(book), exchange_of(frame, "User:x"), frame))
    assert isinstance(outcome, Answer)
    [(_, code, message)] = results_of(ApiKey.ALTER_CONFIGS, 1, outcome.response)
    assert code == 29 and "remove x-data-policy" in message
    assert book.policies == {"orders": PII}


# ------------------------------------------------------------------ DescribeConfigs


def describe(resources: list[tuple[str, list[str] | None]], version: int) -> bytes:
    cls = schemas.request_schema(ApiKey.DESCRIBE_CONFIGS, version)
    rcls = entities.element_class(cls, "resources")
    request = entities.build(cls, include_synonyms=True, include_documentation=True,
                             resources=tuple(entities.build(
                                 rcls, resource_type=2, resource_name=n,
                                 configuration_keys=tuple(k) if k is not None else None)
                                 for n, k in resources))
    return (request_header_bytes(ApiKey.DESCRIBE_CONFIGS, version, 7, "admin")
            + encode_request(request))


def describe_answer(names: list[str], version: int) -> bytes:
    cls = entities.response_class(ApiKey.DESCRIBE_CONFIGS, version)
    rcls = entities.element_class(cls, "results")
    ccls = entities.element_class(rcls, "configs")
    response = entities.build(cls, results=tuple(entities.build(
        rcls, error_code=0, error_message=None, resource_type=2, resource_name=n,
        configs=(entities.build(ccls, name="retention.ms", value="5", read_only=False,
                                config_source=1, is_sensitive=False, synonyms=(),
                                config_type=5, documentation=None),)) for n in names))
    return response_header_bytes(7, ApiKey.DESCRIBE_CONFIGS, version) + encode_response(response)


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_describe_configs_shows_the_policy(version: int) -> None:
    book = Book(policies={"orders": PII, "asked-other": PII})
    ctx = ctx_with(book)
    path = PolicyDescribePath()
    frame = describe([("orders", None), ("plain", None), ("asked-other", ["retention.ms"])],
                     version)
    outcome = path.on_request(ctx, exchange_of(frame), frame)
    assert isinstance(outcome, Forward) and outcome.pin is path
    exchange = exchange_of(frame)
    exchange.state = outcome.state
    respond = path.on_response(ctx, exchange,
                               describe_answer(["orders", "plain", "asked-other"], version))
    size = len(response_header_bytes(7, ApiKey.DESCRIBE_CONFIGS, version))
    response = decode_response(ApiKey.DESCRIBE_CONFIGS, version, bytes(respond.frame)[size:])
    configs = {str(r.resource_name): {str(c.name): c for c in r.configs}
               for r in response.results}
    assert set(configs["plain"]) == {"retention.ms"}
    assert set(configs["asked-other"]) == {"retention.ms"}  # not asked for the key
    entry = configs["orders"]["x-data-policy"]
    assert entry.value == PII and int(entry.config_source) == 1 and not entry.is_sensitive
    assert [(s.name, s.value) for s in entry.synonyms] == [("x-data-policy", PII)]


def test_describe_of_a_broker_resource_is_not_decoded_further() -> None:
    cls = schemas.request_schema(ApiKey.DESCRIBE_CONFIGS, 4)
    rcls = entities.element_class(cls, "resources")
    request = entities.build(cls, include_synonyms=False, include_documentation=False,
                             resources=(entities.build(rcls, resource_type=4, resource_name="1",
                                                       configuration_keys=None),))
    frame = request_header_bytes(ApiKey.DESCRIBE_CONFIGS, 4, 7, "a") + encode_request(request)
    outcome = PolicyDescribePath().on_request(ctx_with(Book()), exchange_of(frame), frame)
    assert isinstance(outcome, Forward) and outcome.pin is None


# ------------------------------------------------------------------ records and bindings


def test_fleet_view_folds_policy_records() -> None:
    view = FleetView()
    assert view.apply(b"policy:orders", policy_record_value("orders", PII, ADMIN), 0, 5)
    record = view.policies["orders"]
    assert record.value == PII and record.set_by == ADMIN and record.version == (0, 5)
    assert record.policy is not None and record.policy.filters[0].name == "pii"
    assert view.filters == {}
    assert view.apply(b"policy:orders", b"{broken", 0, 6)
    assert view.policies["orders"].policy is None and "orders" in str(view.policies["orders"].error)
    assert view.apply(b"policy:orders", None, 0, 7)
    assert view.policies == {}


def test_bindings_add_the_topic_and_merge_config() -> None:
    base = FilterSpec(name="pii", module="builtin:pii-mask", topics=("users",),
                      apply_to=frozenset({"produce"}), config={"mask": "*", "other": 1})
    records = {
        "orders": parse_policy_record("orders", policy_record_value("orders", PII, ADMIN)),
        "gone": parse_policy_record("gone", policy_record_value(
            "gone", '{"filters":[{"name":"removed","apply_to":["fetch","produce"]}]}', ADMIN)),
        "bad": parse_policy_record("bad", json.dumps({"format": 1, "value": "{"}).encode()),
    }
    bindings = {b.topic: b for b in policy_bindings(records, {"pii": base})}
    orders = bindings["orders"].spec
    assert bindings["orders"].blocked is None
    assert (orders.name, orders.topics, orders.apply_to, dict(orders.config)) == (
        "policy:orders/pii", ("orders",), frozenset({"produce"}), {"mask": "#", "other": 1})
    for topic in ("gone", "bad"):
        spec = bindings[topic].spec
        assert spec.module == "builtin:block" and spec.topics == (topic,)
        assert spec.apply_to == frozenset({"produce", "fetch"})
    assert "not deployed" in str(bindings["gone"].blocked)


def test_block_filter_fails_every_partition(tmp_path: Any) -> None:
    spec = FilterSpec(name="policy:t/pii", module="builtin:block", topics=("t",),
                      apply_to=frozenset({"produce", "fetch"}),
                      config={"code": 56, "reason": "gone"})
    chain = FilterChain([load_filter(spec, cache_dir=tmp_path)])
    batch = make_batch([b"a", b"b"])
    produced = filter_produce(chain, RecordContext("t", 0, "produce"), batch)
    assert produced.records is None and produced.error_code == 56
    assert "gone" in str(produced.error_message)
    fetched = filter_fetch(chain, RecordContext("t", 0, "fetch"), batch)
    assert fetched.error_code == 56 and not bytes(fetched.records)
    other = filter_produce(chain, RecordContext("u", 0, "produce"), batch)
    assert other.records is batch and other.error_code == 0
    chain.close()
    with pytest.raises(FilterLoadError, match=r"config\.code"):
        load_filter(dataclasses.replace(spec, config={"code": "x"}), cache_dir=tmp_path)


def test_resending_the_value_in_force_is_no_change() -> None:
    # kafka-python's AlterConfigs re-sends every modified config it described, this one too.
    book = Book(policies={"orders": PII})
    api = ApiKey.ALTER_CONFIGS
    frame = alter([("orders", [("x-data-policy", PII), ("retention.ms", "9")])])
    outcome = settle(AdminPath().on_request(ctx_with(book), exchange_of(frame, "User:x"), frame))
    assert isinstance(outcome, Forward) and outcome.frame is not None
    sent = sent_request(api, 1, frame, outcome)
    assert [[c.name for c in r.configs] for r in sent.resources] == [["retention.ms"]]
    exchange = exchange_of(frame, "User:x")
    exchange.state = outcome.state
    response = settle(AdminPath().on_response(ctx_with(book), exchange,
                                              broker_answer(api, 1, [("orders", 0)])))
    assert results_of(api, 1, response.frame) == [("orders", 0, None)]
    assert book.written == [] and book.policies == {"orders": PII}
