"""The built-in model's definition in plain Python: what its next token is, given the whole
context. handoff_vllm.tiny_model writes Llama weights that compute exactly this, and the
verdict compares every response with `continuation`: a reference that the deployment under
test did not compute.

The rule: every prompt opens with the anchor word (`ANCHOR`, t1), which the model never
outputs. The next token after the last token `x` of the context is `after_even[x]` when `x`
stands an even number of positions after the anchor, else `after_odd[x]` (also when the
context holds no anchor, where the weights may give another word still: without the anchor,
their sink, the context's fingerprint can overtake the rule in a short context). The two
successor maps are permutations of the output words, drawn from the seed, that never agree and
never map a word to itself. So the continuation depends on
the last token, on the anchor's presence and on the count of every token between the anchor
and the end: a context that lost its prompt, lost or gained one token anywhere after the
anchor, or rendered the chat template twice, continues differently within two tokens. A token
replaced by another one earlier in the context is not seen (docs/cases.md).
"""

from __future__ import annotations

import random
from functools import cache

from handoff.word_tokenizer import BOS_ID, WORDS

ANCHOR = BOS_ID
#: The chat template's two markers, around the user's message.
USER, ASSISTANT = 3, 4
CHAT_TEMPLATE = "t3 {% for m in messages %}{{ m['content'] }} {% endfor %}t4"
#: Outputs are the words t100 and above; the words below are the anchor and markers.
FIRST_OUTPUT = 100
VOCAB = WORDS + 1  # the words and the unknown word


@cache
def successors(seed: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`after_even` and `after_odd`, indexed by token id: maps into the output words that are
    permutations of them on the output words, never agree, and have no fixed point."""
    rng = random.Random(seed)
    outputs = list(range(FIRST_OUTPUT, WORDS))
    maps = []
    for _ in range(2):
        cycle = outputs[:]
        rng.shuffle(cycle)  # one cycle through every output word: no fixed point
        step = dict(zip(cycle, cycle[1:] + cycle[:1], strict=True))
        maps.append([step.get(x, rng.choice(outputs)) for x in range(VOCAB)])
    even, odd = maps
    for x in range(VOCAB):  # where the two agree, give odd another image
        while odd[x] == even[x]:
            if not FIRST_OUTPUT <= x < WORDS:  # not an output word: any other image will do
                odd[x] = rng.choice(outputs)
                continue
            y = rng.choice(outputs)  # swap with y's image, keeping odd a permutation
            if odd[y] not in (x, even[x]) and odd[x] not in (y, even[y]):
                odd[x], odd[y] = odd[y], odd[x]
    return tuple(even), tuple(odd)


@cache
def returning(seed: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`successors` of `seed` with `after_odd` the inverse of `after_even` on the output words:
    the walk comes back to a word two tokens later, so outputs repeat (the close model's
    rule, whose words a penalty on repeats can overtake: handoff_vllm.weights.CLOSE). The two
    still never agree, as a single cycle has no word two steps from itself."""
    even, odd = successors(seed)
    back = list(odd)
    for x in range(FIRST_OUTPUT, WORDS):
        back[even[x]] = x
    return even, tuple(back)


def continuation(context: list[int], count: int, seed: int = 0) -> list[int]:
    """The `count` tokens the model gives after `context` at temperature 0."""
    anchors = [i for i, token in enumerate(context) if token == ANCHOR]
    if len(anchors) > 1:
        raise ValueError(f"the context holds the anchor t{ANCHOR} {len(anchors)} times")
    even, odd = successors(seed)
    tokens = list(context)
    for _ in range(count):
        at_even = bool(anchors) and (len(tokens) - 1 - anchors[0]) % 2 == 0
        tokens.append((even if at_even else odd)[tokens[-1]])
    return tokens[len(context) :]


def context_of(prompt: str, api: str) -> list[int]:
    """The token ids the engine is given for `prompt`: its words, inside the chat template's
    markers for a chat request."""
    ids = [int(word[1:]) for word in prompt.split()]
    return [USER, *ids, ASSISTANT] if api == "chat" else ids


def words(tokens: list[int]) -> list[str]:
    return [f"t{token}" for token in tokens]
