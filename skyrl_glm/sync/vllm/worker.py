"""The receiver inside vLLM: a worker extension (``worker_extension_cls``) driven by ``collective_rpc``.

It receives an update through a registered transport, verifies it (:class:`AdapterReceiver`), and stages
the rebuilt public tensors with SkyRL 0.4's in-memory LoRA loader (``skyrl-memory://<name>``), under a
name that carries the version, so the engine can load the new version while the old one still serves.
Arguments and results are plain data (str, int, dict): nothing is unpickled from the sync peer.

Every method takes the call's MAC first (:mod:`skyrl_glm.sync.vllm.control`) and checks it before anything else,
then its arguments' types; commit and discard act only on names this worker staged itself in this run. A refused
receive is an answer (``ok: False``); a refused commit, discard or listing raises
:class:`~skyrl_glm.sync.vllm.control.ControlRefused`. Either way nothing changes.
"""

from __future__ import annotations

from typing import Any

import torch
from skyrl.backends.skyrl_train.patches.vllm.patch_lora_in_memory import (
    discard_in_memory_adapter,
    stage_in_memory_adapter,
)

from skyrl_glm.plugins import registry
from skyrl_glm.sync.expert_layout import layout_of
from skyrl_glm.sync.manifest import MAX_MANIFEST_BYTES
from skyrl_glm.sync.receiver import AdapterReceiver, UpdateRejected
from skyrl_glm.sync.transports.base import Transport
from skyrl_glm.sync.update import describe_error
from skyrl_glm.sync.vllm.control import ControlRefused, verify


def staged_name(lora_name: str, version: int) -> str:
    return f"{lora_name}@v{version}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class LoraSyncWorkerExtension:
    """Methods mixed into vLLM's worker; each is reached as ``llm.collective_rpc("<method>", args=signed(...))``."""

    def _skyrl_glm_receiver(self) -> AdapterReceiver:
        if not hasattr(self, "_skyrl_glm_rx"):
            device = getattr(self, "device", None) or torch.device("cpu")
            lora_config = getattr(getattr(self, "vllm_config", None), "lora_config", None)
            self._skyrl_glm_rx = AdapterReceiver(device=device, layout=layout_of(lora_config))
        return self._skyrl_glm_rx

    def _skyrl_glm_transport(self, name: str) -> Transport:
        """The receiving end of transport ``name`` (a subclass hands a collective transport its group)."""
        return registry().transport(name)()

    def _skyrl_glm_staged_here(self) -> dict[str, int]:
        """Staged name -> version, for what this worker staged in this run (the only names commit/discard take)."""
        if not hasattr(self, "_skyrl_glm_names"):
            self._skyrl_glm_names: dict[str, int] = {}
        return self._skyrl_glm_names

    def _skyrl_glm_serving(self) -> str | None:
        version = self._skyrl_glm_receiver().version
        return next((n for n, v in self._skyrl_glm_staged_here().items() if v == version), None)

    def skyrl_glm_receive(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Receive and verify one update, then stage it. Never raises: a refusal is returned with its reason."""
        try:
            if len(args) > 1 and isinstance(args[1], str) and len(args[1]) > MAX_MANIFEST_BYTES:
                raise ControlRefused(f"manifest of {len(args[1])} bytes exceeds {MAX_MANIFEST_BYTES}")
            manifest_json, handle, transport, *more = verify("skyrl_glm_receive", args, kwargs, (3, 4))
            check = more[0] if more else True
            if not isinstance(transport, str) or not isinstance(check, bool):
                raise ControlRefused("skyrl_glm_receive: transport must be a string and verify a boolean")
            tx = self._skyrl_glm_transport(transport)
            adapter = self._skyrl_glm_receiver().receive(manifest_json, handle, tx, verify=check)
            name = staged_name(adapter.lora_name, adapter.version)
            stage_in_memory_adapter(name, adapter.tensors, adapter.adapter_config)
            self._skyrl_glm_staged_here()[name] = adapter.version
        except ControlRefused as e:
            return {"ok": False, "reason": f"control call refused: {e}"}
        except UpdateRejected as e:
            return {"ok": False, "reason": e.reason}
        except Exception as e:  # noqa: BLE001 - any failure is a rejection, the old adapter keeps serving
            return {"ok": False, "reason": describe_error(e)}
        return {"ok": True, "staged": name, "version": adapter.version, "timings": adapter.timings}

    def skyrl_glm_commit(self, *args: Any, **kwargs: Any) -> list[str]:
        """Record ``version`` (one this worker staged, newer than the serving one) as serving and drop the staged
        adapters not in ``keep`` (names this worker staged); returns what stays staged."""
        version, keep = verify("skyrl_glm_commit", args, kwargs, (2, 2))
        mine = self._skyrl_glm_staged_here()
        if not _is_int(version) or version not in mine.values():
            raise ControlRefused(f"skyrl_glm_commit: version {version!r:.40} was not staged by this worker")
        serving = self._skyrl_glm_receiver().version
        if serving is not None and version <= serving:
            raise ControlRefused(f"skyrl_glm_commit: version {version} is not newer than the serving {serving}")
        if not isinstance(keep, list) or any(not isinstance(n, str) or n not in mine for n in keep):
            raise ControlRefused("skyrl_glm_commit: keep must list names this worker staged")
        self._skyrl_glm_receiver().commit(version)
        for name in [n for n in mine if n not in keep]:
            discard_in_memory_adapter(name)
            del mine[name]
        return sorted(mine)

    def skyrl_glm_discard(self, *args: Any, **kwargs: Any) -> bool:
        """Drop a staged adapter this worker staged that is not the serving one."""
        (name,) = verify("skyrl_glm_discard", args, kwargs, (1, 1))
        mine = self._skyrl_glm_staged_here()
        if not isinstance(name, str) or name not in mine:
            raise ControlRefused(f"skyrl_glm_discard: {name!r:.80} was not staged by this worker")
        if name == self._skyrl_glm_serving():
            raise ControlRefused(f"skyrl_glm_discard: {name!r} is serving")
        del mine[name]
        return discard_in_memory_adapter(name)

    def skyrl_glm_staged(self, *args: Any, **kwargs: Any) -> list[str]:
        """Names of the adapters this worker staged and still holds (read only)."""
        verify("skyrl_glm_staged", args, kwargs, (0, 0))
        return sorted(self._skyrl_glm_staged_here())
