"""The host side of the Wasm filter chain, the filter SDK, and the filters we ship.

Nothing here touches a socket: the proxy hands records in and takes decisions out.
"""
