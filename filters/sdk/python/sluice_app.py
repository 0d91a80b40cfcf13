"""The component's world (sluice:filter/sluice-filter@1.0.0) around the user's filter.py:
`sluice filter build` names this module as componentize-py's app. Importing ``filter`` runs the
user's file at build time (componentize-py pre-initialises the interpreter with everything
imported), so an instance starts with the callback already registered.

Buffers arrive and leave as Latin-1 strings (one character per byte, see the WIT file);
every exception becomes the world's error string, which the host counts as a filter error.
"""

import gc

import filter  # noqa: F401  (registers the callback)
import sluice_filter
import wit_world
from componentize_py_types import Err

# Everything imported so far (the standard library modules, the SDK, the filter) lives as
# long as the instance: moved out of the collector's reach, a full collection no longer walks
# the whole pre-initialised heap in the middle of a batch.
gc.freeze()


def _error(exc: BaseException) -> Err:
    return Err(f"{type(exc).__name__}: {exc}"[:500])


class WitWorld(wit_world.WitWorld):
    def abi_version(self) -> int:
        return sluice_filter.ABI_VERSION

    def init(self, config: str) -> None:
        try:
            sluice_filter.init(config)
        except Exception as exc:
            raise _error(exc) from None

    def filter(self, batch: str) -> str:
        try:
            return sluice_filter.filter_batch(batch.encode("latin-1")).decode("latin-1")
        except Exception as exc:
            raise _error(exc) from None

    # Exported only by the world sluice-filter-admin (a filter.py that uses on_admin): under
    # the plain world, componentize-py ignores this method.
    def admin(self, request: str) -> str:
        try:
            return sluice_filter.admin(request)
        except Exception as exc:
            raise _error(exc) from None

    def filter_records(self, batch: str) -> str:
        try:
            return sluice_filter.filter_records(batch.encode("latin-1")).decode("latin-1")
        except Exception as exc:
            raise _error(exc) from None
