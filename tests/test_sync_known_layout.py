"""The receiver's layout memo: an update whose layout is identical to the last accepted one reuses that validation.

Validation is a pure function of the layout, so reusing the verdict is exact; these tests show that a layout that
differs anywhere is still validated in full and rejected with its reason, that the per-update fields are always
checked, that a rejected update never becomes the layout the receiver remembers, and (the control) that the memo is
really used.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from skyrl_glm.sync import aliases, receiver
from skyrl_glm.sync import manifest as manifest_module
from skyrl_glm.sync.manifest import Manifest, ManifestError
from skyrl_glm.sync.plan import build_plan
from skyrl_glm.sync.receiver import AdapterReceiver, UpdateRejected
from skyrl_glm.sync.transports.shm import SharedMemoryTransport

E = "base_model.model.model.layers.1.mlp.experts."
Q = "base_model.model.model.layers.0.self_attn.q_proj."


def adapter(seed: int = 0) -> dict[str, torch.Tensor]:
    """Dense q_proj plus 8 experts sharing one A/B pair (the manifest carries alias runs for them)."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(4, 16, generator=g), torch.randn(32, 4, generator=g)
    out = {Q + "lora_A.weight": torch.randn(4, 16, generator=g), Q + "lora_B.weight": torch.randn(16, 4, generator=g)}
    for e in range(8):
        out[f"{E}{e}.gate_proj.lora_A.weight"] = a
        out[f"{E}{e}.gate_proj.lora_B.weight"] = b
    return out


def plan(version: int, seed: int = 0):
    return build_plan(
        adapter(seed), adapter_config={"r": 4, "lora_alpha": 8}, lora_name="p", version=version, shared_storage=True
    )


def send(rx: AdapterReceiver, p, text: str | None = None):
    """Stage ``p`` on shared memory; ``rx`` receives ``text`` (default: p's manifest) and commits what it accepts."""
    tx = SharedMemoryTransport()
    handle = tx.prepare(p)
    try:
        got = rx.receive(p.manifest.to_json() if text is None else text, handle, tx)
    finally:
        tx.release()
    rx.commit(got.version)
    return got


def edited(p, edit) -> str:
    d = json.loads(p.manifest.to_json())
    edit(d)
    return json.dumps(d)


def warm() -> AdapterReceiver:
    rx = AdapterReceiver()
    send(rx, plan(1))
    assert rx.known is not None and rx.known.version == 1
    return rx


def _row(d: dict, name: str) -> int:
    return next(i for i, t in enumerate(d["layout"]["tensors"]) if t[0] == name)


def _drop_q_b(d: dict) -> None:
    i = _row(d, Q + "lora_B.weight")
    del d["layout"]["tensors"][i]
    d["checksums"] = d["checksums"][: 16 * i] + d["checksums"][16 * (i + 1) :]


def _reshape_q_a(d: dict) -> None:
    d["layout"]["tensors"][_row(d, Q + "lora_A.weight")][2] = [2, 32]  # same bytes, rank 2


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda d: d["layout"]["alias_runs"].append(list(d["layout"]["alias_runs"][0])), "overlap"),
        (_reshape_q_a, "shape mismatch: 1 LoRA tensors without rank r=4"),
        (lambda d: d["layout"]["tensors"][1].__setitem__(3, d["layout"]["tensors"][1][3] + 1), "misaligned"),
        (lambda d: d["layout"]["tensors"][1].__setitem__(3, d["layout"]["tensors"][1][3] - 64), "overlaps"),
        (_drop_q_b, "missing tensors: 1"),
        (lambda d: d["layout"]["tensors"][0][2].__setitem__(0, 4.0), "list of non-negative integers"),  # == 4
        (lambda d: d["layout"].update(total_bytes=float(d["layout"]["total_bytes"])), "'total_bytes' must be an int"),
        (lambda d: d["layout"]["adapter_config"].update(r=4.0, lora_alpha=4.0), "r=4.0 is not a positive integer"),
    ],
    ids=[
        "overlapping-run",
        "wrong-rank",
        "misaligned-offset",
        "overlapping-offset",
        "tensor-removed",
        "float-dim",
        "float-total",
        "float-r",
    ],
)
def test_a_layout_that_differs_anywhere_is_validated_in_full(edit, reason):
    """Warm receiver, next version, one change in the layout: rejected with its reason; the known layout stays."""
    rx = warm()
    known = rx.known
    p = plan(2)
    with pytest.raises(UpdateRejected, match=reason):
        send(rx, p, edited(p, edit))
    assert rx.known is known
    send(rx, plan(3))  # the receiver still serves the next good update


@pytest.mark.parametrize(
    ("checksums", "reason"),
    [
        (lambda c: ("0" if c[0] != "0" else "1") + c[1:], "checksum mismatch on"),
        (lambda c: c[:-1], "checksums: 63 characters for 4 tensors, expected 64"),
        (lambda c: c.upper(), "checksums: not all lowercase hex digits"),
        (lambda c: 5, "'checksums' must be a string"),
    ],
)
def test_an_identical_layout_still_has_its_checksums_checked(checksums, reason):
    rx = warm()
    p = plan(2, seed=1)  # new values, the same layout
    text = edited(p, lambda d: d.update(checksums=checksums(d["checksums"])))
    assert Manifest.from_json(p.manifest.to_json(), known=rx.known).same_layout(rx.known)
    with pytest.raises(UpdateRejected, match=reason):
        send(rx, p, text)
    assert rx.known.version == 1


def test_per_update_fields_are_checked_with_an_identical_layout():
    rx = warm()
    p = plan(2)
    with pytest.raises(UpdateRejected, match="not newer than the serving version 1"):
        send(rx, plan(1))
    for edit, reason in [
        (lambda d: d.update(version=2.0), "'version' must be an integer, got float"),
        (lambda d: d.update(version=True), "'version' must be an integer, got bool"),
        (lambda d: d.update(extra=[]), "'extra' must be an object"),
    ]:
        with pytest.raises(UpdateRejected, match=reason):
            send(rx, p, edited(p, edit))
    assert send(rx, p).version == 2


def test_a_rejected_update_never_becomes_the_known_layout():
    """A layout the structure check refuses is refused every time it comes, before and after a good update (it would
    be accepted the second time if a rejected update were remembered); a checksum failure is not remembered either."""
    rx = AdapterReceiver()
    bad = plan(1)
    bad_text = edited(bad, _reshape_q_a)
    for _ in range(2):
        with pytest.raises(UpdateRejected, match="shape mismatch"):
            send(rx, bad, bad_text)
        assert rx.known is None
    corrupt = plan(1)
    with pytest.raises(UpdateRejected, match="checksum mismatch"):
        send(rx, corrupt, edited(corrupt, lambda d: d.update(checksums="0" * len(d["checksums"]))))
    assert rx.known is None
    send(rx, plan(2))
    good = rx.known
    for version in (3, 4):
        p = plan(version)
        with pytest.raises(UpdateRejected, match="shape mismatch"):
            send(rx, p, edited(p, _reshape_q_a))
        assert rx.known is good


def test_the_memo_is_used_for_an_identical_layout(monkeypatch):
    """Control: the second update with the same layout builds no name index and runs no structure check; a third
    with another layout does both again. Fails if the receiver stops passing its known manifest, if from_json stops
    reusing it, or if the structure check stops being skipped."""
    p1, p2 = plan(1), plan(2, seed=1)
    other = build_plan(
        {k: v for k, v in adapter().items() if not k.startswith(E)},
        adapter_config={"r": 4, "lora_alpha": 8},
        lora_name="p",
        version=3,
    )
    calls = {"structure": 0, "index": 0}  # counted on the receiving side only (the plans are built)
    real_structure, real_index = receiver.structure_errors, aliases.NameIndex.__init__

    def counted_structure(m):
        calls["structure"] += 1
        return real_structure(m)

    def counted_index(self, *a, **k):
        calls["index"] += 1
        real_index(self, *a, **k)

    monkeypatch.setattr(receiver, "structure_errors", counted_structure)
    monkeypatch.setattr(aliases.NameIndex, "__init__", counted_index)
    rx = AdapterReceiver()
    first = send(rx, p1)
    assert calls == {"structure": 1, "index": 1}
    known = rx.known
    second = send(rx, p2)
    assert calls == {"structure": 1, "index": 1}
    assert rx.known.tensors is known.tensors and rx.known.names is known.names
    assert rx.known.run_names is known.run_names and set(second.tensors) == set(first.tensors)
    assert rx.known.spans is known.spans  # the checksums' span table and its columns, derived once per layout
    assert not torch.equal(first.tensors[Q + "lora_A.weight"], second.tensors[Q + "lora_A.weight"])
    send(rx, other)
    assert calls == {"structure": 2, "index": 2}


def test_a_reordered_but_equal_layout_is_validated_in_full_and_accepted():
    """Key order is not part of the JSON value, but the memo compares exact encodings: a reordered layout is simply
    validated again (same verdict)."""
    rx = warm()
    p = plan(2)
    text = edited(p, lambda d: d.update(layout=dict(reversed(d["layout"].items()))))
    assert not Manifest.from_json(text, known=rx.known).same_layout(rx.known)
    assert send(rx, p, text).version == 2


def outcome(text: str, known: Manifest | None):
    """What from_json makes of ``text``: the manifest's fields, or the refusal."""
    try:
        m = Manifest.from_json(text, known=known)
    except ManifestError as e:
        return "refused", str(e)
    fields = ("version", "checksums", "extra", "lora_name", "adapter_config", "tensors", "aliases", "alias_runs")
    return tuple(getattr(m, f) for f in fields)


def test_the_layout_of_an_identical_layout_is_not_even_parsed(monkeypatch):
    """The sender writes the layout's text unchanged each update: the receiver compares that text with the known
    layout's and parses only the fields around it (control: the parses' sizes, and the known objects handed on)."""
    rx = warm()
    p = plan(2, seed=1)
    text = p.manifest.to_json()
    parsed: list[int] = []
    real = manifest_module.json.loads
    monkeypatch.setattr(manifest_module.json, "loads", lambda s, *a, **k: parsed.append(len(s)) or real(s, *a, **k))
    got = Manifest.from_json(text, known=rx.known)
    assert parsed and max(parsed) < len(rx.known.layout_json)  # the fields around the layout, not the layout
    assert got.aliases is rx.known.aliases and got.same_layout(rx.known) and got.version == 2
    monkeypatch.undo()
    assert outcome(text, rx.known) == outcome(text, None)  # as the full parse reads it
    assert send(rx, p).version == 2


@pytest.mark.parametrize(
    "hostile",
    [
        lambda t: t[:-1] + ',"layout":{}}',  # a second layout after extra: JSON keeps the last one
        lambda t: '{"layout":{},' + t[1:],  # a second layout before: the last one (the known one) counts
        lambda t: '{"x":1,' + t[1:],  # a field the manifest does not have
        lambda t: t.replace(',"extra":', '},"extra":', 1),  # the layout's object closed twice: not JSON
        lambda t: t.replace('{"format"', '{"n":{"format"', 1).replace(',"layout":', '},"layout":', 1),  # nested
        lambda t: t.replace(',"extra":{}}', ',"extra":{"a":[1,2]}}'),  # extra with values: still only extra
        lambda t: t + " ",  # trailing whitespace: JSON allows it
        lambda t: t + "x",  # trailing garbage
    ],
    ids=["layout-after", "layout-before", "unknown-field", "not-json", "nested", "extra-values", "space", "garbage"],
)
def test_text_around_the_known_layout_is_read_exactly_as_the_full_parse_reads_it(hostile):
    """Whatever surrounds the known layout's text, the manifest (or the refusal) is the full parse's."""
    rx = warm()
    text = hostile(plan(2, seed=1).manifest.to_json())
    assert outcome(text, rx.known) == outcome(text, None)


def test_a_checksum_mismatch_names_the_tensor_it_is_in():
    """The checksums are compared as one string; the reason names the tensor whose 16 digits differ first."""
    rx = warm()
    p = plan(2, seed=1)
    names = [t.name for t in p.manifest.tensors]
    for k in (1, len(names) - 1):
        digits = list(p.manifest.checksums)
        digits[16 * k + 7] = "0" if digits[16 * k + 7] != "0" else "1"
        new = "".join(digits)
        text = edited(p, lambda d, new=new: d.update(checksums=new))
        with pytest.raises(UpdateRejected, match=f"checksum mismatch on '{re.escape(names[k])}'"):
            send(rx, p, text)
    assert send(rx, p).version == 2


def test_a_layout_the_receiver_holds_can_be_named_by_its_digest() -> None:
    """A manifest may name its layout by digest instead of carrying it (the sender does once the layout was
    accepted: the same text every update, 7.3 MB of 7.7 at grouped experts' 25,014 tensors): the receiver takes its
    known layout, checks the update's own fields and bytes as ever, and serves it."""
    rx = warm()
    known = rx.known
    p2 = plan(2, seed=1)
    text = p2.manifest.to_json(layout=False)
    assert '"layout":' not in text and p2.manifest.layout_digest in text and len(text) < len(p2.manifest.to_json())
    got = send(rx, p2, text)
    assert got.version == 2 and rx.known.tensors is known.tensors
    assert torch.equal(got.tensors[Q + "lora_A.weight"], adapter(1)[Q + "lora_A.weight"])
    tampered = plan(3, seed=2).manifest.with_update(3, "f" * 16 + plan(3, seed=2).manifest.checksums[16:])
    with pytest.raises(UpdateRejected, match="checksum mismatch"):  # named, its bytes still checked
        send(rx, plan(3, seed=2), tampered.to_json(layout=False))


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda d: d.update(layout_digest="0" * 64), "unknown layout '0000000000000000'"),
        (lambda d: d.update(layout_digest="\u0660" * 64), "unknown layout"),  # not ASCII: still one refusal
        (lambda d: d.update(layout_digest=7), "'layout_digest' must be a string"),
        (lambda d: d.pop("layout_digest"), "missing field 'layout' (or 'layout_digest'"),
        (lambda d: d.update(layout={}), "both layout and layout_digest"),
    ],
    ids=["another-digest", "non-ascii", "not-a-string", "neither", "both"],
)
def test_a_digest_that_names_no_layout_held_here_is_refused_and_the_version_stays(edit, reason) -> None:
    """A manifest without a layout was taken as the known one's before (any text that named none); now only the
    known layout's own digest names it, and a receiver that holds no layout refuses every digest."""
    rx = warm()
    p2 = plan(2, seed=1)
    d = json.loads(p2.manifest.to_json(layout=False))
    edit(d)
    with pytest.raises(UpdateRejected, match=re.escape(reason)):
        send(rx, p2, json.dumps(d))
    assert rx.version == 1 and rx.known.version == 1
    with pytest.raises(UpdateRejected, match="unknown layout"):
        send(AdapterReceiver(), p2, p2.manifest.to_json(layout=False))  # nothing accepted there yet
