"""The receiver inside vLLM: a worker extension (``worker_extension_cls``) driven by ``collective_rpc``.

It receives an update through a registered transport, verifies it (:class:`AdapterReceiver`), and stages
the rebuilt public tensors with SkyRL 0.4's in-memory LoRA loader (``skyrl-memory://<name>``), under a
name that carries the version, so the engine can load the new version while the old one still serves.
Arguments and results are plain data (str, int, dict): nothing is unpickled from the sync peer.
"""

from __future__ import annotations

from typing import Any

import torch
from skyrl.backends.skyrl_train.patches.vllm.patch_lora_in_memory import (
    discard_in_memory_adapter,
    stage_in_memory_adapter,
    staged_adapter_names,
)

from skyrl_glm.plugins import registry
from skyrl_glm.sync.receiver import AdapterReceiver, UpdateRejected
from skyrl_glm.sync.transports.base import Transport
from skyrl_glm.sync.update import describe_error


def staged_name(lora_name: str, version: int) -> str:
    return f"{lora_name}@v{version}"


class LoraSyncWorkerExtension:
    """Methods mixed into vLLM's worker; each is reached as ``llm.collective_rpc("<method>", args=...)``."""

    def _skyrl_glm_receiver(self) -> AdapterReceiver:
        if not hasattr(self, "_skyrl_glm_rx"):
            device = getattr(self, "device", None) or torch.device("cpu")
            self._skyrl_glm_rx = AdapterReceiver(device=device)
        return self._skyrl_glm_rx

    def _skyrl_glm_transport(self, name: str) -> Transport:
        """The receiving end of transport ``name`` (a subclass hands a collective transport its group)."""
        return registry().transport(name)()

    def skyrl_glm_receive(
        self, manifest_json: str, handle: dict[str, Any], transport: str, verify: bool = True
    ) -> dict[str, Any]:
        """Receive and verify one update, then stage it. Never raises: a rejection is returned with its reason."""
        try:
            tx = self._skyrl_glm_transport(transport)
            adapter = self._skyrl_glm_receiver().receive(manifest_json, handle, tx, verify=bool(verify))
            name = staged_name(adapter.lora_name, adapter.version)
            stage_in_memory_adapter(name, adapter.tensors, adapter.adapter_config)
        except UpdateRejected as e:
            return {"ok": False, "reason": e.reason}
        except Exception as e:  # noqa: BLE001 - any failure is a rejection, the old adapter keeps serving
            return {"ok": False, "reason": describe_error(e)}
        return {"ok": True, "staged": name, "version": adapter.version, "timings": adapter.timings}

    def skyrl_glm_commit(self, version: int, keep: list[str]) -> list[str]:
        """Record ``version`` as serving and drop staged adapters not in ``keep``; returns what is staged."""
        self._skyrl_glm_receiver().commit(version)
        for name in staged_adapter_names():
            if name not in keep:
                discard_in_memory_adapter(name)
        return staged_adapter_names()

    def skyrl_glm_discard(self, name: str) -> bool:
        return discard_in_memory_adapter(name)

    def skyrl_glm_staged(self) -> list[str]:
        """Names of the adapters staged in this worker (read only)."""
        return staged_adapter_names()
