"""Building and editing decoded kio entities without naming per-version classes.

The proxy answers some requests itself (a rejected partition, a denied topic) and must build
response entities for whatever version the client speaks. The element class of a tuple field is
read from the schema's type hints, so one piece of code serves every version.
"""

from __future__ import annotations

import dataclasses
import datetime
import typing
from typing import Any

from kio.schema.errors import ErrorCode

from sluice.codec import schemas

_hint_cache: dict[type[Any], dict[str, Any]] = {}
_element_cache: dict[tuple[type[Any], str], type[Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    hints = _hint_cache.get(cls)
    if hints is None:
        hints = _hint_cache[cls] = typing.get_type_hints(cls)
    return hints


def element_class(cls: type[Any], field_name: str) -> type[Any]:
    """The entity class held by `field_name` (a tuple of entities, or a single entity)."""
    key = (cls, field_name)
    found = _element_cache.get(key)
    if found is None:
        found = _element_cache[key] = _element_class(cls, field_name)
    return found


def _element_class(cls: type[Any], field_name: str) -> type[Any]:
    tp = _hints(cls)[field_name]
    origin = typing.get_origin(tp)
    if origin is not None and origin is not tuple:  # Optional[X] or tuple[X, ...] | None
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
        origin = typing.get_origin(tp)
    if origin is tuple:
        return typing.cast(type[Any], typing.get_args(tp)[0])
    return typing.cast(type[Any], tp)


def has_field(cls: type[Any], name: str) -> bool:
    return name in _hints(cls)


def response_class(api_key: int, version: int) -> type[Any]:
    return schemas.response_schema(api_key, version)


def build(cls: type[Any], **values: Any) -> Any:
    """An entity of `cls` from the given values, keeping only fields this version has, and
    filling required fields this version adds with neutral values."""
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in values:
            value = values[f.name]
            if f.name == "error_code" and not isinstance(value, ErrorCode):
                value = ErrorCode(value)
            kwargs[f.name] = value
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = _neutral(hints[f.name])
    return cls(**kwargs)


def _neutral(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is tuple:
        return ()
    args = typing.get_args(tp)
    if type(None) in args:
        return None
    if tp is ErrorCode:
        return ErrorCode(0)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp)  # a required nested entity (ShareFetch's current_leader)
    if isinstance(tp, type) and issubclass(tp, datetime.timedelta):
        # Throttle times and the like: no delay. kio's phantom types construct via parse().
        parse: Any = getattr(tp, "parse", tp)
        return parse(datetime.timedelta(0))
    if isinstance(tp, type):
        if issubclass(tp, bool):
            return tp(False)
        if issubclass(tp, int):
            return tp(-1) if tp.__name__ in ("i64", "BrokerId") else tp(0)
        if issubclass(tp, str):
            return tp("")
    try:
        return tp(0)
    except Exception:
        return None
