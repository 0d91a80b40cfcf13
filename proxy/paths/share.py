"""The share-group refusal: KIP-932 ShareFetch carries records the fetch path does not filter.

While fetch filters are in force, ShareFetch and ShareAcknowledge are neither advertised
(`apiversions.py` hides them) nor relayed, in any version: a request closes the connection,
and so does a response of either that was in flight when a fetch filter was installed, so
that no record reaches a client without passing the fetch filters in force.
ShareAcknowledge carries no records, but it only makes sense for records a ShareFetch
delivered: refusing it too keeps the share group API all or nothing. The other share-group
APIs (ShareGroupHeartbeat, ShareGroupDescribe and the share offsets admin APIs) carry no
records and pass as bytes.
"""

from __future__ import annotations

from sluice.codec.messages import ApiKey
from sluice.proxy.paths.base import Exchange, Frame, PathContext, Refuse

UNFILTERED_RECORD_APIS = frozenset({int(ApiKey.SHARE_FETCH), int(ApiKey.SHARE_ACKNOWLEDGE)})


class ShareRefusalPath:
    name = "share-refusal"
    api_keys = UNFILTERED_RECORD_APIS

    def wants_request(self, ctx: PathContext, api_key: int) -> bool:
        return ctx.filters_on("fetch")

    def wants_response(self, ctx: PathContext, api_key: int, version: int) -> bool:
        return ctx.filters_on("fetch")

    def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Refuse:
        return Refuse(self._reason(exchange))

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Refuse:
        return Refuse(self._reason(exchange))

    @staticmethod
    def _reason(exchange: Exchange) -> str:
        hdr = exchange.header
        return (
            f"{ApiKey(hdr.api_key).name} v{hdr.api_version} returns records the fetch filters "
            "do not see; refused while fetch filters are configured"
        )
