"""Record encryption: the stored envelope layout, JSON field encryption, KMS clients, data keys.

Used by the ``builtin:encrypt`` host filter (`record_filter`) and the ``sluice keys`` command.
docs/ENCRYPTION.md describes the threat model, the key lifecycle and the stored layout.
"""
