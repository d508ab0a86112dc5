"""A small real tokenizer for tiny checkpoints: byte-level BPE trained locally on a shipped corpus,
with GLM's special tokens and a GLM-style chat template (no hub access is needed or used)."""

from __future__ import annotations

from importlib import resources

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]

# GLM-4/5 style: a [gMASK]<sop> prefix, role tags, the assistant turn opened by the generation prompt.
CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """Train the BPE; the result depends only on the corpus and ``vocab_size`` (deterministic)."""
    corpus = resources.files("skyrl_glm.data").joinpath("tiny_corpus.txt").read_text().splitlines()
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )
