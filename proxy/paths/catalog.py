"""Every API path of the proxy, in the order the router consults them (earlier wins)."""

from __future__ import annotations

from sluice.proxy.paths.addresses import AddressPath
from sluice.proxy.paths.admin import AdminPath
from sluice.proxy.paths.apiversions import ApiVersionsPath
from sluice.proxy.paths.base import ApiPath
from sluice.proxy.paths.fetch import FetchPath
from sluice.proxy.paths.internal_topics import InternalTopicsPath
from sluice.proxy.paths.policy import PolicyDescribePath
from sluice.proxy.paths.produce import ProducePath
from sluice.proxy.paths.registry import VersionTable
from sluice.proxy.paths.sasl import SaslPath
from sluice.proxy.paths.share import ShareRefusalPath


def standard_paths(versions: VersionTable) -> list[ApiPath]:
    # Fetch before the address path: with fetch filters the fetch path decodes the response
    # and rewrites its endpoints itself; without them the address path scans it.
    # The internal-topics path comes first and hands each request and response to the path
    # the others would have chosen, once the proxy's own topics are out of it.
    paths: list[ApiPath] = [
        SaslPath(),
        ApiVersionsPath(versions),
        ProducePath(),
        FetchPath(),
        ShareRefusalPath(),
        AdminPath(),
        PolicyDescribePath(),
        AddressPath(),
    ]
    return [InternalTopicsPath(paths), *paths]
