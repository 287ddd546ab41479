"""A word-level tokenizer that needs no download: token id N is the word `tN`.

Every token decodes to one visible word, so a prompt of n words is n tokens, a streamed chunk
is one word, and a reader of the logs sees the tokens. The mocker serves it alone; the vLLM
backend's built-in model (handoff_vllm.tiny_model) puts seeded Llama weights behind it.
"""

from __future__ import annotations

import json
from pathlib import Path

#: Words t0 .. t4095, and the unknown word after them.
WORDS = 4096
VOCAB_SIZE = WORDS + 1
UNKNOWN = "<unk>"
BOS_ID, EOS_ID = 1, 2
#: A chat request is its message's words and nothing else: no template tokens.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def write_tokenizer(folder: Path, chat_template: str = CHAT_TEMPLATE) -> None:
    """Write tokenizer.json and tokenizer_config.json into `folder`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {f"t{i}": i for i in range(WORDS)} | {UNKNOWN: WORDS}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNKNOWN))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(cleanup=False)
    tokenizer.save(str(folder / "tokenizer.json"))
    write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": f"t{BOS_ID}",
            "eos_token": f"t{EOS_ID}",
            "unk_token": UNKNOWN,
            "model_max_length": 1_000_000,
            "chat_template": chat_template,
        },
    )


#: A prompt's words run over 900 words of the vocabulary from its first, which is t100 for
#: variant 0, t101 for variant 1, ...: DISTINCT_PROMPTS prompts that start differently.
SPAN = 900
DISTINCT_PROMPTS = WORDS - 100 - SPAN


def prompt(tokens: int, variant: int = 0) -> str:
    """`tokens` words of the vocabulary, one token each and no template tokens, from word
    t(100 + variant) on, wrapping after 900 words."""
    first = 100 + variant % DISTINCT_PROMPTS
    return " ".join(f"t{first + i % SPAN}" for i in range(tokens))


def count(text: str) -> int:
    """Tokens in `text` of this tokenizer's output: one per word."""
    return len(text.split())


def token_ids(text: str) -> list[int] | None:
    """The token ids of `text` of this tokenizer's words (`tN` is id N); None where a word is
    not one of them."""
    ids = [token_id(word) for word in text.split()]
    return None if None in ids else ids


def token_id(word: str) -> int | None:
    """The id of `word` (`tN`, with or without the space the detokenizer puts before it), or
    None where it is not a word of this tokenizer."""
    word = word.strip()
    if word[:1] == "t" and word[1:].isdigit() and int(word[1:]) < WORDS:
        return int(word[1:])
    return None


def write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")
