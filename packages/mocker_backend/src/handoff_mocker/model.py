"""A tiny local model folder the mocker can serve: a word-level tokenizer, no download.

The mocker draws output ids from 1000-1999 and never emits EOS; with token id N spelled `tN`,
every streamed chunk is one visible word, so a reader of the logs sees the tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

VOCAB_SIZE = 4096
UNKNOWN = "<unk>"
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def write_model(folder: Path) -> None:
    """Write tokenizer.json, tokenizer_config.json and config.json into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {f"t{i}": i for i in range(VOCAB_SIZE)} | {UNKNOWN: VOCAB_SIZE}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNKNOWN))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(cleanup=False)
    tokenizer.save(str(folder / "tokenizer.json"))
    _write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "t1",
            "eos_token": "t2",
            "unk_token": UNKNOWN,
            "model_max_length": 1_000_000,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _write_json(
        folder / "config.json",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": VOCAB_SIZE + 1,
            "max_position_embeddings": 4096,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "num_hidden_layers": 2,
        },
    )


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")
