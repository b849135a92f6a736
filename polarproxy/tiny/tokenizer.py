"""Train the tiny byte-level BPE tokenizer (Qwen-style pre-tokenization) with the `tokenizers` library."""

from __future__ import annotations

from typing import TYPE_CHECKING

from polarproxy.tiny import corpus

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# The Qwen2 pre-tokenizer split pattern.
SPLIT_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ADDED_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
VOCAB_SIZE = 4096


def train_tokenizer(
    seed: int = 0,
    vocab_size: int = VOCAB_SIZE,
    *,
    special: tuple[str, ...] = SPECIAL_TOKENS,
    added: tuple[str, ...] = ADDED_TOKENS,
) -> Tokenizer:
    """Train the BPE model on the built-in corpus; the total vocabulary, added tokens included, is at
    most `vocab_size`. The `special` tokens (chat markup) and the `added` tokens (tags the model writes
    as text) take the last IDs."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False)
    n_added = len(special) + len(added)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - n_added,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    # The chat markup must not be learned as merges: strip it from the training text.
    markup = special + added

    def texts():
        for doc in corpus.documents(seed):
            for m in markup:
                doc = doc.replace(m, "\n")
            yield doc

    tok.train_from_iterator(texts(), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    return tok
