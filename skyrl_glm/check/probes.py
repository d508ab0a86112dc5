"""The fixed, deterministic token set the check scores: same seed -> same tokens, on any machine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Probes:
    sequences: list[list[int]]  # scored whole through the prefill path (prompt logprobs)
    prompts: list[list[int]]  # continued by the sampler for the decode path
    decode_tokens: int


def make_probes(
    vocab_size: int, *, num: int = 4, length: int = 32, prompt_length: int = 12, decode_tokens: int = 8, seed: int = 0
) -> Probes:
    """Random token ids in [8, vocab_size) (low ids hold special tokens in the tiny tokenizers)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    seqs = torch.randint(8, vocab_size, (num, length), generator=gen).tolist()
    return Probes(sequences=seqs, prompts=[s[:prompt_length] for s in seqs], decode_tokens=decode_tokens)
