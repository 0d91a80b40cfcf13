"""Lazy look-ups into kio's schema index: which (api_key, version) pairs exist, and which are
flexible.

kio generates one module per (API, version, request/response); importing all ~600 of them takes
seconds, so schemas are loaded on first use and remembered.
"""

from __future__ import annotations

from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.static.constants import EntityType

from .errors import UnsupportedVersion

__all__ = [
    "known_versions",
    "request_schema",
    "response_schema",
    "schema_flexible",
]

_request_cache: dict[tuple[int, int], type[Any] | None] = {}
_response_cache: dict[tuple[int, int], type[Any] | None] = {}
_flex_cache: dict[tuple[int, int, bool], bool] = {}


def known_versions(api_key: int, request: bool) -> list[int]:
    """Sorted versions for which kio has a request (or response) schema; [] if none."""
    name = api_key_map.get(api_key)
    if name is None:
        return []
    kind = EntityType.request if request else EntityType.response
    return sorted(v for v, m in schema_name_map[name].items() if kind in m)


def _load(api_key: int, version: int, request: bool) -> type[Any] | None:
    cache = _request_cache if request else _response_cache
    key = (api_key, version)
    try:
        return cache[key]
    except KeyError:
        pass
    schema: type[Any] | None
    try:
        if request:
            schema = load_request_schema(api_key, version)
        else:
            schema = load_response_schema(api_key, version)
    except Exception:  # kio raises its own index errors, ImportError, ...
        schema = None
    cache[key] = schema
    return schema


def request_schema(api_key: int, version: int) -> type[Any]:
    """kio request class for (api_key, version); UnsupportedVersion if kio has none."""
    schema = _load(api_key, version, True)
    if schema is None:
        raise UnsupportedVersion(f"no request schema for api_key={api_key} version={version}")
    return schema


def response_schema(api_key: int, version: int) -> type[Any]:
    """kio response class for (api_key, version); UnsupportedVersion if kio has none."""
    schema = _load(api_key, version, False)
    if schema is None:
        raise UnsupportedVersion(f"no response schema for api_key={api_key} version={version}")
    return schema


def schema_flexible(api_key: int, version: int, request: bool) -> bool:
    """Whether the body of this request/response uses the flexible (KIP-482) encoding.

    Versions kio lacks are judged by their neighbours: versions below the oldest known one
    predate flexible encoding of that API (flexibility only ever starts at some version and
    stays), versions above the newest known one share its flexibility. An API key kio does not
    know at all raises UnsupportedVersion.
    """
    key = (api_key, version, request)
    try:
        return _flex_cache[key]
    except KeyError:
        pass
    schema = _load(api_key, version, request)
    if schema is not None:
        flexible = bool(schema.__flexible__)
    else:
        versions = known_versions(api_key, request)
        if not versions:
            raise UnsupportedVersion(f"unknown api_key={api_key}")
        if version < versions[0]:
            flexible = False
        else:
            newest = _load(api_key, versions[-1], request)
            flexible = bool(newest is not None and newest.__flexible__)
    _flex_cache[key] = flexible
    return flexible
