"""The fixed, deterministic token set the check scores: same seed -> same tokens, on any machine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Probes:
    sequences: list[list[int]]  # scored whole through the prefill path (prompt logprobs)
    prompts: list[list[int]]  # continued by the sampler for the decode path
    decode_tokens: int


# The probe set's shape, the CLI's and a SkyRL run's defaults alike: 4 x 8 decode tokens, so that one token's bf16
# gap (0.48 once on tiny GLM-5.3, measured on one H200) cannot carry the decode mean over its bound on its own.
NUM_PROBES, PROBE_LENGTH, PROMPT_LENGTH, DECODE_TOKENS = 4, 32, 12, 8


def make_probes(
    vocab_size: int,
    *,
    num: int = NUM_PROBES,
    length: int = PROBE_LENGTH,
    prompt_length: int = PROMPT_LENGTH,
    decode_tokens: int = DECODE_TOKENS,
    seed: int = 0,
) -> Probes:
    """Random token ids in [8, vocab_size) (low ids hold special tokens in the tiny tokenizers)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    seqs = torch.randint(8, vocab_size, (num, length), generator=gen).tolist()
    return Probes(sequences=seqs, prompts=[s[:prompt_length] for s in seqs], decode_tokens=decode_tokens)
