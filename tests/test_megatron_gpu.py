"""The Megatron trainer against transformers on the GPU: SkyRL's Megatron worker builds GLM models through
Megatron-Bridge (Transformer Engine layers, Megatron-Core's MLA and DSA), so its logprobs must be HF's. Two tiny
checkpoints (GLM-5.3: MLA + DSA + MoE; GLM-4.5: GQA + MoE) are built as Bridge builds them in SkyRL (LoRA on
attention, dense MLP, shared and routed experts, ``share_expert_adapters``), every LoRA B set to seeded noise, and
scored on the same tokens by Megatron and by HF + PEFT holding the adapter Bridge exports.

Tolerance (bf16 Megatron vs fp32 HF, per token logprob): mean |dlogp| <= 0.02, max <= 0.25. The same scoring
against HF without the adapter must differ by more (the noise is large enough to be seen), so a LoRA lost on the
way fails. HF + PEFT cannot hold routed-expert LoRA on transformers 5's fused experts: those go into the Megatron
model but are zeroed for the comparison (their export to vLLM is what the training-loop check proves).

GPU only, and only where Transformer Engine and Megatron-Bridge import (the GPU kit's [megatron] archive).
``SKYRL_GLM_GPU_RESULTS=DIR`` keeps the figures as ``DIR/megatron_parity_<model>.json``.
"""

from __future__ import annotations

import os
import re

import pytest
from gpu_vllm import keep_result

pytestmark = [pytest.mark.gpu]
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("transformer_engine.pytorch")
pytest.importorskip("megatron.bridge")

RANK, ALPHA, NOISE = 8, 16, 0.05
TARGETS = ["linear_q_down_proj", "linear_q_up_proj", "linear_kv_down_proj", "linear_qkv", "linear_proj"]
TARGETS += ["linear_fc1", "linear_fc2"]
ROUTED = re.compile(r"\.mlp\.experts\.")
MEAN_TOL, MAX_TOL = 0.02, 0.25


@pytest.fixture(scope="module")
def parallel_state():
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    if not dist.is_initialized():
        dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    mpu.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(0)
    yield
    mpu.destroy_model_parallel()


def _megatron(model_dir, family):
    from megatron.bridge import AutoBridge
    from megatron.bridge.peft.lora import LoRA

    family.supply_defaults()
    bridge = AutoBridge.from_hf_pretrained(str(model_dir), trust_remote_code=True)
    provider = bridge.to_megatron_provider(load_weights=True)
    for key in ("tensor", "pipeline", "expert", "context"):
        setattr(provider, f"{key}_model_parallel_size" if key != "context" else "context_parallel_size", 1)
    provider.expert_tensor_parallel_size = 1
    provider.gradient_accumulation_fusion = False  # as SkyRL sets it (no APEX fused wgrad)
    provider.moe_token_dispatcher_type = "alltoall"  # SkyRL's default (Bridge's flex dispatcher needs DeepEP)
    provider.mtp_num_layers = None
    provider.finalize()
    lora = LoRA(target_modules=TARGETS, dim=RANK, alpha=ALPHA, lora_B_init_method="zero", share_expert_adapters=True)
    provider.register_pre_wrap_hook(lambda m: lora(m))  # after the provider's own hook, which loads the weights
    model = provider.provide_distributed_model(wrap_with_ddp=False, bf16=True)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model[0].named_parameters():
            if "adapter.linear_out" in name and not ROUTED.search(name):
                p.copy_((torch.randn(p.shape, generator=gen) * NOISE).to(p))
    return bridge, model


def _megatron_logprobs(model, ids):
    with torch.no_grad():
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        logits = model[0](input_ids=ids, position_ids=pos, attention_mask=None).float()
    return torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]


def _hf_logprobs(model, ids):
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    return torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]


@pytest.mark.parametrize("name", ["glm-5.3", "glm-4.5"])
def test_megatron_with_lora_scores_as_hf_with_the_exported_adapter(name, parallel_state, tmp_path) -> None:
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    from skyrl_glm.models.tiny import make_tiny
    from skyrl_glm.plugins import registry

    family = registry().model(name)
    model_dir = make_tiny(family, tmp_path / name, seed=0)
    bridge, meg = _megatron(model_dir, family)
    ids = torch.randint(0, family.tiny_vocab_size, (1, 96), generator=torch.Generator().manual_seed(1)).cuda()
    meg_lp = _megatron_logprobs(meg, ids)

    exported = {n: t.float() for n, t in bridge.export_adapter_weights(meg, cpu=True, show_progress=False)}
    kept = {n: t for n, t in exported.items() if not ROUTED.search(n)}
    targets = sorted({n.split(".lora_")[0].rsplit(".", 1)[-1] for n in kept})
    hf = family.load_pretrained(str(model_dir), torch.float32).cuda().eval()
    base_lp = _hf_logprobs(hf, ids)
    peft = get_peft_model(hf, LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=targets, lora_dropout=0.0))
    prefix = "base_model.model."  # PEFT's own state-dict names
    state = {n if n.startswith(prefix) else prefix + n: t for n, t in kept.items()}
    missing = set_peft_model_state_dict(peft, state).unexpected_keys
    assert not missing, f"exported names PEFT did not take: {sorted(missing)[:5]}"
    hf_lp = _hf_logprobs(peft, ids)

    diff, off = (meg_lp - hf_lp).abs(), (meg_lp - base_lp).abs()
    figures = {
        "model": name,
        "tokens": int(diff.numel()),
        "exported_names": len(exported),
        "compared_targets": targets,
        "mean_abs_dlogp": float(diff.mean()),
        "max_abs_dlogp": float(diff.max()),
        "without_adapter_mean_abs_dlogp": float(off.mean()),
        "tolerance": {"mean": MEAN_TOL, "max": MAX_TOL},
    }
    keep_result(f"megatron_parity_{name}.json", figures)
    assert figures["mean_abs_dlogp"] <= MEAN_TOL and figures["max_abs_dlogp"] <= MAX_TOL, figures
    assert figures["without_adapter_mean_abs_dlogp"] > 4 * MEAN_TOL, figures  # the adapter is seen at all
