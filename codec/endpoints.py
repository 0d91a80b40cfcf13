"""Rewrite every broker endpoint (node id + host + port) inside a decoded response.

Which responses carry broker addresses, and where, is read from the kio schemas themselves
rather than listed by hand: any entity with a ``host`` and a ``port`` field next to a
``node_id``/``broker_id``/``leader_id`` is a broker endpoint. This finds Metadata brokers,
FindCoordinator (old top-level and new ``coordinators`` list), DescribeCluster brokers, and the
KIP-951 ``node_endpoints`` of Produce v10+ and Fetch v16+ responses, and any later API that
carries endpoints the same way.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable
from typing import Any

from kio.serial._introspect import get_field_tag

from sluice.codec import schemas

_ID_FIELDS = ("node_id", "broker_id", "leader_id")

# (path of field names to walk, is-a-sequence at each step) to every endpoint entity.
Path = tuple[tuple[str, bool], ...]

EndpointMapper = Callable[[int, str, int], tuple[str, int]]


def _entity_class(tp: Any) -> tuple[type[Any] | None, bool]:
    """The dataclass inside a field type, and whether it is a tuple of them."""
    origin = typing.get_origin(tp)
    if origin is tuple:
        args = typing.get_args(tp)
        if args and dataclasses.is_dataclass(args[0]):
            return typing.cast(type[Any], args[0]), True
        return None, False
    if origin is typing.Union or str(origin) == "types.UnionType":
        for arg in typing.get_args(tp):
            cls, seq = _entity_class(arg)
            if cls is not None:
                return cls, seq
        return None, False
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp, False
    return None, False


def _is_endpoint(cls: type[Any]) -> bool:
    names = {f.name for f in dataclasses.fields(cls)}
    return "host" in names and "port" in names and any(n in names for n in _ID_FIELDS)


def _paths(cls: type[Any], prefix: Path = ()) -> list[Path]:
    found: list[Path] = []
    if _is_endpoint(cls):
        found.append(prefix)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        sub, seq = _entity_class(hints.get(f.name))
        if sub is not None:
            found.extend(_paths(sub, (*prefix, (f.name, seq))))
    return found


@functools.cache
def endpoint_paths(api_key: int, version: int) -> tuple[Path, ...]:
    """Paths to broker endpoints in the response schema of (api_key, version); () if none."""
    try:
        cls = schemas.response_schema(api_key, version)
    except Exception:
        return ()
    return tuple(_paths(cls))


def carries_endpoints(api_key: int, version: int) -> bool:
    return bool(endpoint_paths(api_key, version))


@functools.cache
def endpoints_only_in_tags(api_key: int, version: int) -> bool:
    """Whether every endpoint of the response schema sits under a top-level tagged field (the
    KIP-951 ``node_endpoints`` of Produce v10+ and Fetch v16+): a response without top-level
    tagged fields then has none to rewrite."""
    paths = endpoint_paths(api_key, version)
    if not paths:
        return False
    cls = schemas.response_schema(api_key, version)
    tagged = {f.name for f in dataclasses.fields(cls) if get_field_tag(f) is not None}
    return all(path and path[0][0] in tagged for path in paths)


def _node_id(entity: Any) -> int:
    for name in _ID_FIELDS:
        value = getattr(entity, name, None)
        if value is not None:
            return int(value)
    return -1


def _rewrite_at(entity: Any, path: Path, mapper: EndpointMapper) -> Any:
    if not path:
        node_id = _node_id(entity)
        host, port = entity.host, entity.port
        if node_id < 0 or not host or port is None or port < 0:
            return entity
        new_host, new_port = mapper(node_id, host, int(port))
        if (new_host, new_port) == (host, port):
            return entity
        return dataclasses.replace(entity, host=new_host, port=type(port)(new_port))
    (name, seq), rest = path[0], path[1:]
    value = getattr(entity, name)
    if value is None:
        return entity
    if seq:
        items = tuple(_rewrite_at(item, rest, mapper) for item in value)
        if all(a is b for a, b in zip(items, value, strict=True)):
            return entity
        return dataclasses.replace(entity, **{name: items})
    new = _rewrite_at(value, rest, mapper)
    return entity if new is value else dataclasses.replace(entity, **{name: new})


def rewrite_endpoints(entity: Any, api_key: int, version: int, mapper: EndpointMapper) -> Any:
    """The entity with every broker endpoint mapped; the same object if nothing changed."""
    for path in endpoint_paths(api_key, version):
        entity = _rewrite_at(entity, path, mapper)
    return entity
