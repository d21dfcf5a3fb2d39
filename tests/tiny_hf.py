"""Tiny Hugging Face models built locally for tests (no download, no network).

``make_model`` builds a 2-layer Gemma 3 (one sliding-window layer with a window
shorter than the test prompts, one full-attention layer) or Llama with random
weights. ``make_byte_tokenizer`` trains a small byte-level BPE tokenizer, which
round-trips any text (the engine contract joins decoded tokens back into the text).
Callers import torch/transformers lazily through these functions, so importing this
module needs neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Words of the engine-contract prompts, so that labels such as " positive" are single tokens.
CONTRACT_CORPUS = [
    "Classify the sentiment of each movie review as positive or negative.",
    "Review: a wonderful, moving film. Sentiment: positive",
    "Review: boring and far too long. Sentiment: negative",
    "Review: dull. Sentiment: negative",
    "Name a colour: red, green, blue. Count to five: one, two, three, four, five.",
    "Answer briefly. The film was good. very good indeed. Summarise: Note:",
] * 20

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]


def make_byte_tokenizer(corpus: Sequence[str] = CONTRACT_CORPUS, vocab_size: int = 400) -> Any:
    """A byte-level BPE tokenizer trained on ``corpus``; it adds [BOS] to encoded contexts."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    raw = Tokenizer(models.BPE(unk_token=None))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    raw.train_from_iterator(list(corpus), trainer)
    raw.post_processor = processors.TemplateProcessing(
        single="[BOS] $A", special_tokens=[("[BOS]", raw.token_to_id("[BOS]"))]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="[BOS]", eos_token="[EOS]", pad_token="[PAD]", unk_token="[UNK]"
    )


def make_model(tokenizer: Any, family: str = "gemma3", *, seed: int = 0, max_positions: int = 256) -> Any:
    """A 2-layer causal LM with random weights, in eval mode (float32, CPU)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=0.2,  # peakier than the default so distributions differ by context
    )
    if family == "gemma3":
        config = transformers.Gemma3TextConfig(
            sliding_window=4, layer_types=["sliding_attention", "full_attention"], **common
        )
        model = transformers.Gemma3ForCausalLM(config)
    elif family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        raise ValueError(f"family: must be 'gemma3' or 'llama', got {family!r}")
    return model.eval()
