"""The receiver inside vLLM: a worker extension (``worker_extension_cls``) driven by ``collective_rpc``.

It receives an update through a registered transport, verifies it (:class:`AdapterReceiver`), and stages
the rebuilt public tensors with SkyRL 0.4's in-memory LoRA loader (``skyrl-memory://<name>``), under a
name that carries the version, so the engine can load the new version while the old one still serves.
Arguments and results are plain data (str, int, dict): nothing is unpickled from the sync peer.

Every method takes the call's MAC first (:mod:`skyrl_glm.sync.vllm.control`) and checks it before anything else,
then its arguments' types; commit and discard act only on names this worker staged itself in this run. A refused
receive is an answer (``ok: False``); a refused commit, discard or listing raises
:class:`~skyrl_glm.sync.vllm.control.ControlRefused`. Either way nothing changes. ``collective_rpc`` reaches any
attribute of the worker by name, so the class holds only the :data:`CONTROL_METHODS` (and a flag); its state and
helpers live outside it (:func:`receiver_state`), so no name returns an object vLLM cannot send back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from skyrl.backends.skyrl_train.patches.vllm.patch_lora_in_memory import (
    discard_in_memory_adapter,
    stage_in_memory_adapter,
)

from skyrl_glm.sync.expert_layout import layout_of
from skyrl_glm.sync.manifest import MAX_MANIFEST_BYTES
from skyrl_glm.sync.receiver import AdapterReceiver, UpdateRejected
from skyrl_glm.sync.transports import needs_group, open_transport
from skyrl_glm.sync.transports.base import Transport, TransportError
from skyrl_glm.sync.update import describe_error
from skyrl_glm.sync.vllm.control import ControlRefused, verify
from skyrl_glm.sync.vllm.load_memo import forget_structure, note_structure


def staged_name(lora_name: str, version: int) -> str:
    return f"{lora_name}@v{version}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# The methods ``collective_rpc`` may name on this extension, each checking its MAC first (the allow-list; a test
# enumerates the class so a new method cannot slip in). Everything else of the extension's is state (not callable)
# or a module function below, out of reach of a method name.
CONTROL_METHODS = ("skyrl_glm_receive", "skyrl_glm_commit", "skyrl_glm_discard", "skyrl_glm_staged")


@dataclass
class ReceiverState:
    """One worker's receiving side: the verifier, what it staged in this run (staged name -> version, the only
    names commit and discard take) and the trainer's sync group once joined."""

    receiver: AdapterReceiver
    staged: dict[str, int] = field(default_factory=dict)
    group: Any = None
    joined: bool = False

    @property
    def serving(self) -> str | None:
        return next((n for n, v in self.staged.items() if v == self.receiver.version), None)

    def newest(self) -> dict[str, int]:
        """Adapter name -> the newest version of it staged here (what a next update must exceed)."""
        out: dict[str, int] = {}
        for name, version in self.staged.items():
            lora_name = name.rpartition("@v")[0]
            out[lora_name] = max(version, out.get(lora_name, version))
        return out


def receiver_state(worker: Any) -> ReceiverState:
    """The worker's :class:`ReceiverState`, made on first use (kept in the worker's ``__dict__``)."""
    state = worker.__dict__.get(_STATE)
    if state is None:
        device = getattr(worker, "device", None) or torch.device("cpu")
        layout = layout_of(getattr(worker, "vllm_config", None), loads_3d=worker.skyrl_glm_loads_3d)
        receiver = AdapterReceiver(device=device, layout=layout)
        state = worker.__dict__[_STATE] = ReceiverState(receiver)
    return state


_STATE = "_skyrl_glm_state"


def _drop_staged(name: str) -> bool:
    """A staged adapter gone: SkyRL's staging of it and the receiver's note on its structure."""
    forget_structure(name)
    return discard_in_memory_adapter(name)


def receiving_transport(worker: Any, state: ReceiverState, name: str) -> Transport:
    """The receiving end of transport ``name``: a collective one over the trainer's group once the worker joined it
    (a worker that needs the group, :attr:`LoraSyncWorkerExtension.skyrl_glm_group_required`, never falls back to
    vLLM's own world group: the trainer is not in it)."""
    if needs_group(name) and state.group is None and worker.skyrl_glm_group_required:
        raise TransportError("this worker has not joined the trainer's sync group (skyrl_glm_join_group)")
    return open_transport(name, state.group)


class LoraSyncWorkerExtension:
    """Methods mixed into vLLM's worker; each is reached as ``llm.collective_rpc("<method>", args=signed(...))``."""

    skyrl_glm_group_required = False  # a collective transport needs the group of skyrl_glm_join_group
    skyrl_glm_loads_3d = True  # skyrl-glm's loader sends LoRARequest(is_3d_lora_weight=True) to a stacked-3d engine

    def skyrl_glm_receive(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Receive and verify one update, then stage it. Never raises: a refusal is returned with its reason. Its
        timings are the receiver's stages and ``worker_s``, the whole call inside the worker (the rest of a caller's
        round trip is the RPC's own)."""
        t0 = time.perf_counter()
        try:
            if len(args) > 1 and isinstance(args[1], str) and len(args[1]) > MAX_MANIFEST_BYTES:
                raise ControlRefused(f"manifest of {len(args[1])} bytes exceeds {MAX_MANIFEST_BYTES}")
            manifest_json, handle, transport, *more = verify("skyrl_glm_receive", args, kwargs, (3, 4))
            check = more[0] if more else True
            if not isinstance(transport, str) or not isinstance(check, bool):
                raise ControlRefused("skyrl_glm_receive: transport must be a string and verify a boolean")
            state = receiver_state(self)
            tx = receiving_transport(self, state, transport)
            adapter = state.receiver.receive(manifest_json, handle, tx, verify=check, staged=state.newest())
            name = staged_name(adapter.lora_name, adapter.version)
            stage_in_memory_adapter(name, adapter.tensors, adapter.adapter_config)
            if adapter.structure is not None:
                note_structure(name, adapter.structure)
            state.staged[name] = adapter.version
        except ControlRefused as e:
            return {"ok": False, "reason": f"control call refused: {e}"}
        except UpdateRejected as e:
            return {"ok": False, "reason": e.reason}
        except Exception as e:  # noqa: BLE001 - any failure is a rejection, the old adapter keeps serving
            return {"ok": False, "reason": describe_error(e)}
        timings = {**adapter.timings, "worker_s": time.perf_counter() - t0}
        return {"ok": True, "staged": name, "version": adapter.version, "timings": timings}

    def skyrl_glm_commit(self, *args: Any, **kwargs: Any) -> list[str]:
        """Record ``version`` (one this worker staged, newer than the serving one) as serving and drop the staged
        adapters not in ``keep`` (names this worker staged); returns what stays staged."""
        version, keep = verify("skyrl_glm_commit", args, kwargs, (2, 2))
        state = receiver_state(self)
        mine = state.staged
        if not _is_int(version) or version not in mine.values():
            raise ControlRefused(f"skyrl_glm_commit: version {version!r:.40} was not staged by this worker")
        serving = state.receiver.version
        if serving is not None and version <= serving:
            raise ControlRefused(f"skyrl_glm_commit: version {version} is not newer than the serving {serving}")
        if not isinstance(keep, list) or any(not isinstance(n, str) or n not in mine for n in keep):
            raise ControlRefused("skyrl_glm_commit: keep must list names this worker staged")
        state.receiver.commit(version)
        for name in [n for n in mine if n not in keep]:
            _drop_staged(name)
            del mine[name]
        return sorted(mine)

    def skyrl_glm_discard(self, *args: Any, **kwargs: Any) -> bool:
        """Drop a staged adapter this worker staged that is not the serving one."""
        (name,) = verify("skyrl_glm_discard", args, kwargs, (1, 1))
        state = receiver_state(self)
        if not isinstance(name, str) or name not in state.staged:
            raise ControlRefused(f"skyrl_glm_discard: {name!r:.80} was not staged by this worker")
        if name == state.serving:
            raise ControlRefused(f"skyrl_glm_discard: {name!r} is serving")
        del state.staged[name]
        return _drop_staged(name)

    def skyrl_glm_staged(self, *args: Any, **kwargs: Any) -> list[str]:
        """Names of the adapters this worker staged and still holds (read only)."""
        verify("skyrl_glm_staged", args, kwargs, (0, 0))
        return sorted(receiver_state(self).staged)
