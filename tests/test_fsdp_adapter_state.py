"""The FSDP worker's adapter for the in-memory sync: SkyRL's LoRA state, whole, on the device it trains on.

SkyRL's ``collect_lora_params`` copies every tensor to host memory (right for its file sync); the CUDA IPC
transport refuses host tensors, which stopped SkyRL's loop on one H200 at the first sync. Real PEFT on a tiny
model; the device half runs where CUDA is.
"""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from skyrl.backends.skyrl_train.distributed.fsdp_utils import collect_lora_params

from skyrl_glm.skyrl.workers.fsdp import lora_state_where_it_lives


def _peft(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).to(device)
    model = get_peft_model(base, LoraConfig(r=2, target_modules=["0", "2"], init_lora_weights=False))
    return model


def test_the_same_state_as_skyrl_gathers_and_no_alias_of_a_live_parameter() -> None:
    model = _peft("cpu")
    ours, skyrls = lora_state_where_it_lives(model), collect_lora_params(model)
    assert sorted(ours) == sorted(skyrls) and len(ours) == 4
    assert all(torch.equal(ours[n], skyrls[n]) for n in ours)
    live = {p.data_ptr() for p in model.parameters()}
    assert not {t.data_ptr() for t in ours.values()} & live  # the next optimizer step cannot change what is sent


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_state_stays_on_the_gpu() -> None:
    ours = lora_state_where_it_lives(_peft("cuda"))
    assert {t.device.type for t in ours.values()} == {"cuda"}
