"""A tiny local model folder the mocker can serve: handoff's word-level tokenizer, no download.

The mocker draws output ids from 1000-1999 and never emits EOS; with token id N spelled `tN`
(handoff.word_tokenizer), every streamed chunk is one visible word.
"""

from __future__ import annotations

from pathlib import Path

from handoff.word_tokenizer import BOS_ID, EOS_ID, VOCAB_SIZE, write_json, write_tokenizer


def write_model(folder: Path) -> None:
    """Write tokenizer.json, tokenizer_config.json and config.json into `folder`."""
    write_tokenizer(folder)
    write_json(
        folder / "config.json",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": VOCAB_SIZE,
            "max_position_embeddings": 4096,
            "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "num_hidden_layers": 2,
        },
    )
