"""The adapter-version bookkeeping both vLLM samplers share, driven by a fake engine (no vLLM engine started)."""

from __future__ import annotations

from skyrl_glm.sync.vllm.versions import LoraVersions, drive


class FakeEngine:
    def __init__(self, refuse: bool = False) -> None:
        self.ops: list[tuple] = []
        self.refuse = refuse

    def __call__(self, op):
        self.ops.append(op)
        if op[0] == "add_lora" and self.refuse:
            return ValueError("unexpected module")
        if op[0] == "rpc" and op[1] == "skyrl_glm_receive":
            version = len([o for o in self.ops if o[1:2] == ("skyrl_glm_receive",)])
            return [{"ok": True, "staged": f"policy@v{version}", "version": version}]
        return True


def _update(versions: LoraVersions, engine: FakeEngine):
    return drive(versions.update_steps("{}", {}, "cpu"), engine)


def test_removal_waits_for_requests_in_flight():
    v, eng = LoraVersions(), FakeEngine()
    _update(v, eng)
    held = v.acquire()  # a request starts on v1
    _update(v, eng)
    _update(v, eng)  # v1 is now older than previous, but held
    assert ("remove_lora", 1) not in eng.ops and v.retired() == [1]
    assert eng.ops[-1] == ("rpc", "skyrl_glm_commit", (3, ["policy@v3", "policy@v2", "policy@v1"]))
    removal = v.release(held)
    assert removal is held and v.retired() == [] and v.in_flight() == {}
    eng.ops.clear()
    drive(v.remove_steps(removal), eng)
    assert eng.ops == [("remove_lora", 1), ("rpc", "skyrl_glm_discard", ("policy@v1",))]
    _update(v, eng)  # v2 is not held: removed at the swap, as the offline sampler always did
    assert ("remove_lora", 2) in eng.ops


def test_refused_adapter_keeps_serving_and_discards_staged():
    v = LoraVersions()
    _update(v, FakeEngine())
    serving = v.adapter
    eng = FakeEngine(refuse=True)
    result = _update(v, eng)
    assert not result.ok and "could not load the adapter: ValueError: unexpected module" in result.reason
    assert v.adapter is serving and eng.ops[-1] == ("rpc", "skyrl_glm_discard", ("policy@v1",))
