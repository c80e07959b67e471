"""vLLM's connector base classes when vLLM is importable, stand-ins with the same names,
methods and signatures when it is not (tests and machines without vLLM).

The stand-ins follow vllm/distributed/kv_transfer/kv_connector/v1/base.py at the pinned
commit (see ferry/vllm/__init__.py): KVConnectorRole (SCHEDULER = 0, WORKER = 1),
KVConnectorMetadata and KVConnectorHandshakeMetadata (empty marker classes) and
KVConnectorBase_V1 (__init__(vllm_config, role, kv_cache_config), bind/clear of the
connector metadata, and every method FerryConnector overrides)."""

import enum

try:  # pragma: no cover - only where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: F401
        KVConnectorBase_V1, KVConnectorHandshakeMetadata, KVConnectorMetadata, KVConnectorRole)
    HAVE_VLLM = True
except Exception:  # noqa: B902 - ImportError, or a vLLM too old to have these names
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:
        """Scheduler connector -> worker connectors, once per engine step."""

    class KVConnectorHandshakeMetadata:
        """What a worker tells the scheduler (and peers) about itself, once."""

    class KVConnectorBase_V1:
        """The v1 connector API without vLLM: the same constructor and the metadata binding
        the model runner does before and after each forward pass."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            self._connector_metadata = None
            self._vllm_config = vllm_config
            self._kv_transfer_config = getattr(vllm_config, "kv_transfer_config", None)
            if self._kv_transfer_config is None:
                raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self):
            return self._role

        def bind_connector_metadata(self, connector_metadata):
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self):
            self._connector_metadata = None

        def _get_connector_metadata(self):
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self):
            return self._connector_metadata is not None
