"""One KMS client per distinct ``kms:`` section, shared by the filters that use it.

    kms = open_kms(settings)      # settings: kms.KmsSettings from the config's kms: section

The client (and so the local keyring's parsed file, or boto3's connection pool) is kept for
the life of the process: filters of a reloaded chain reuse it.
"""

from __future__ import annotations

import threading
from pathlib import Path

from sluice.crypto.kms import Kms, KmsSettings
from sluice.crypto.kms_aws import AwsKms
from sluice.crypto.kms_local import LocalKeyring

_clients: dict[KmsSettings, Kms] = {}
_clients_lock = threading.Lock()


def open_kms(settings: KmsSettings) -> Kms:
    """The process-wide client for `settings`."""
    with _clients_lock:
        client = _clients.get(settings)
        if client is None:
            if settings.type == "local":
                assert settings.path is not None
                client = LocalKeyring(Path(settings.path), auto_create=settings.auto_create)
            else:
                client = AwsKms(settings)
            _clients[settings] = client
        return client
