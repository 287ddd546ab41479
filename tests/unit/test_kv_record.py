"""A mocker worker's record of the contexts it holds, assembled from its KV events: the
events as a real mocker worker replayed them (the shape seen on Dynamo 1.6.1's mocker: one
BlockStored event per block, its token ids, its parent)."""

import pytest

from handoff.word_tokenizer import token_ids
from handoff_mocker.kv_record import Block, Unread, after_prefix, chain, split

PROMPT = list(range(300, 332))


def stored(block: int, parent: int | None, tokens: list[int]) -> dict:
    return {
        "type": "BlockStored",
        "block_hashes": [block],
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": len(tokens),
    }


def blocks(*events: dict) -> dict[int, Block]:
    found: dict[int, Block] = {}
    for event in events:
        found.update(split(event))
    return found


CARRIED = [1525, 1726, 1238]
GENERATED = [2913166250 + n for n in range(29)]
NEXT = [760605284 + n for n in range(64)]


def test_the_context_after_the_prompt_is_read_across_blocks():
    record = blocks(
        stored(1, None, PROMPT + CARRIED + GENERATED),
        stored(2, 1, NEXT),
        stored(7, None, list(range(500, 564))),  # another case's request
    )
    assert after_prefix(record, PROMPT) == CARRIED + GENERATED + NEXT


def test_one_event_may_store_several_blocks_each_with_its_share_of_tokens():
    event = stored(1, None, PROMPT + CARRIED + GENERATED + NEXT)
    event.update(block_hashes=[1, 2], block_size=64)
    record = blocks(event)
    assert record[2] == Block(1, tuple(NEXT))
    assert after_prefix(record, PROMPT) == CARRIED + GENERATED + NEXT


def test_no_context_of_the_prompt_or_two_that_part_ways_is_no_record():
    other = blocks(stored(7, None, list(range(500, 564))))
    assert after_prefix(other, PROMPT) is None
    two = blocks(
        stored(1, None, PROMPT + CARRIED + GENERATED),
        stored(2, None, [*PROMPT, 1999, *GENERATED[:31]]),
    )
    assert after_prefix(two, PROMPT) is None


def test_a_block_whose_parent_is_missing_holds_no_context():
    assert chain(blocks(stored(2, 1, NEXT)), 2) is None


def test_an_event_without_token_ids_is_unread_not_empty():
    event = stored(1, None, PROMPT + CARRIED + GENERATED)
    del event["token_ids"]
    with pytest.raises(Unread, match="without a token id for each of its blocks"):
        split(event)


def test_the_word_tokenizers_ids_and_words_that_are_not_its():
    assert token_ids(" t1525 t0 t4095") == [1525, 0, 4095]
    assert token_ids("t4096") is None and token_ids("hello") is None
