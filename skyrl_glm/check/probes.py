"""The fixed, deterministic token set the check scores: same seed -> same tokens, on any machine.

The probe vocabulary: ids are drawn from ``[FIRST_PROBE_ID, vocab_size)`` (the low ids hold special tokens in the
tiny tokenizers), so the model needs more than :data:`FIRST_PROBE_ID` ids and every probe id must be below the
vocabulary of both sides; :func:`check_probe_ids` refuses probes a side cannot score, before any scoring
(a model smaller than the probes used to fail deep inside its embedding with an ``IndexError``).
"""

from __future__ import annotations

from dataclasses import dataclass

from skyrl_glm.usage import UsageError

FIRST_PROBE_ID = 8


class ProbeVocabularyError(UsageError):
    """Probes a model cannot score: an id at or past its vocabulary, or a vocabulary too small for probes."""


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
    """Random token ids in ``[FIRST_PROBE_ID, vocab_size)`` (low ids hold special tokens in the tiny tokenizers);
    :class:`ProbeVocabularyError` for a vocabulary with no id there."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= FIRST_PROBE_ID:
        raise ProbeVocabularyError(
            f"vocab_size {vocab_size!r}: the probes need token ids {FIRST_PROBE_ID}.. below the vocabulary size "
            f"(an integer > {FIRST_PROBE_ID})"
        )
    import torch

    gen = torch.Generator().manual_seed(seed)
    seqs = torch.randint(FIRST_PROBE_ID, vocab_size, (num, length), generator=gen).tolist()
    return Probes(sequences=seqs, prompts=[s[:prompt_length] for s in seqs], decode_tokens=decode_tokens)


def check_probe_ids(probes: Probes, vocab_size: int | None, side: str) -> None:
    """:class:`ProbeVocabularyError` (one line) when ``side``'s model (``vocab_size`` ids; None: not declared, not
    checked) cannot score every probe id, or when there is nothing to score."""
    ids = [t for seq in (*probes.sequences, *probes.prompts) for t in seq]
    if not probes.sequences or not ids:
        raise ProbeVocabularyError("the probes hold no tokens")
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in ids):
        raise ProbeVocabularyError("probe token ids must be integers >= 0")
    if vocab_size is not None and max(ids) >= vocab_size:
        raise ProbeVocabularyError(
            f"probe token id {max(ids)} is past the {side}'s vocabulary of {vocab_size} ids: make the probes with "
            f"make_probes({vocab_size}) (the pytest fixture: vocab_size={vocab_size})"
        )
