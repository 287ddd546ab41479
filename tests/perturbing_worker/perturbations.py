"""Each way a migration or a KV transfer can hand an engine the wrong context, as a function of
the token ids it was given and how many of them are the prompt (the rest: what was generated
before the move). Chosen to find the oracle's blind spots: changes that keep the length, the
last token and the parity of every distance to the anchor (which the rule alone reads) as well
as those that break them; in the prompt, where no earlier check looks, and in the output.

No import beyond the standard library: a worker's `sitecustomize` loads this module."""

from __future__ import annotations

from collections.abc import Callable

#: The first output word and the number of words (handoff.word_tokenizer).
FIRST_WORD, WORDS = 100, 4096


def other(token: int) -> int:
    """Another word than `token`, of the prompt's words."""
    return FIRST_WORD + (token - FIRST_WORD + 457) % (WORDS - FIRST_WORD)


def replaced(at: int) -> Callable[[list[int]], list[int]]:
    return lambda t: [*t[:at], other(t[at]), *t[at + 1 :]]


def block_replaced(at: int, n: int) -> Callable[[list[int]], list[int]]:
    return lambda t: [*t[:at], *map(other, t[at : at + n]), *t[at + n :]]


def dropped(at: int, n: int) -> Callable[[list[int]], list[int]]:
    return lambda t: t[:at] + t[at + n :]


def duplicated(at: int, n: int) -> Callable[[list[int]], list[int]]:
    return lambda t: t[: at + n] + t[at:]


def swapped(at: int, n: int) -> Callable[[list[int]], list[int]]:
    """The `n` tokens at `at` and the `n` after them change places."""
    return lambda t: t[:at] + t[at + n : at + 2 * n] + t[at : at + n] + t[at + 2 * n :]


def moved(at: int, n: int, by: int) -> Callable[[list[int]], list[int]]:
    """The `n` tokens at `at` moved `by` positions later."""
    return lambda t: t[:at] + t[at + n : at + n + by] + t[at : at + n] + t[at + n + by :]


def another_prompt(t: list[int], prompt: int) -> list[int]:
    """Another request's prompt of the same length: every word of it another one, the anchor
    and the chat markers kept (words below FIRST_WORD)."""
    return [other(x) if x >= FIRST_WORD else x for x in t[:prompt]] + t[prompt:]


def template_twice(t: list[int], prompt: int) -> list[int]:
    """The chat template's markers rendered twice around the message."""
    return [t[0], *t[: prompt - 1], t[prompt - 1], *t[prompt - 1 :]]


def perturbations(
    prompt: int, generated: int, chat: bool
) -> dict[str, Callable[[list[int]], list[int]]]:
    """Each wrong context of a context of `prompt` tokens (a `chat` one inside its template's
    markers) and `generated` after them, by name. Positions stand inside the prompt (early, in
    its middle, late) or inside what was generated, wherever they fit."""
    mid, last, out = prompt // 2, prompt - 2, prompt + generated // 2
    found = {
        "an early prompt word replaced": replaced(2),
        "a prompt token replaced": replaced(mid),
        "a late prompt word replaced": replaced(last),
        "a KV block of prompt tokens replaced": block_replaced(32, 32),
        "one prompt token dropped": dropped(mid, 1),
        "two prompt tokens dropped": dropped(mid, 2),
        "sixteen prompt tokens dropped": dropped(mid - 8, 16),
        "one prompt token duplicated": duplicated(mid, 1),
        "two prompt tokens duplicated": duplicated(mid, 2),
        "sixteen prompt tokens duplicated": duplicated(mid - 8, 16),
        "two prompt tokens swapped": swapped(mid, 1),
        "two pairs of prompt tokens swapped": swapped(mid, 2),
        "two blocks of sixteen prompt tokens swapped": swapped(mid - 16, 16),
        "a prompt token moved two places": moved(mid, 1, 2),
        "sixteen prompt tokens moved sixteen places": moved(mid - 16, 16, 16),
        "another request's prompt of the same length": lambda t: another_prompt(t, prompt),
    }
    if chat:
        found["the chat template rendered twice"] = lambda t: template_twice(t, prompt)
    if generated >= 4:
        found |= {
            "a generated token replaced": replaced(out),
            "two generated tokens swapped": swapped(out, 1),
            "one generated token dropped": dropped(out, 1),
            "two generated tokens duplicated": duplicated(out, 2),
        }
    return found


def logprobs_dropped(chunk: dict, index: int) -> dict:
    """The successor's first chunk stripped of its log-probabilities, as a frontend or worker
    that loses a field across the move would send it: the tokens stay right."""
    if index == 0:
        chunk.pop("log_probs", None)
        chunk.pop("top_logprobs", None)
    return chunk


def first_token_replaced(chunk: dict, index: int) -> dict:
    """The successor's first token another word, as an engine that continued a wrong context
    would generate it: a stop string whose match spans the move then never completes."""
    if index == 0 and chunk.get("token_ids"):
        chunk["token_ids"] = [other(chunk["token_ids"][0]), *chunk["token_ids"][1:]]
    return chunk


#: Wrong outputs, by name: each takes the worker's chunk and its place in the response.
OUTPUT_PERTURBATIONS = {
    "the first token's log-probabilities dropped": logprobs_dropped,
    "the first token replaced": first_token_replaced,
}


def sampling_dropped(request: dict) -> dict:
    """The request's sampling replaced by the default one (the best word, no penalty, no
    seed), as a migration that re-issued the context alone would send it."""
    options = dict(request.get("sampling_options") or {})
    options.update(
        temperature=0.0, seed=None, frequency_penalty=0.0, presence_penalty=0.0,
        repetition_penalty=1.0,
    )  # fmt: skip
    return {**request, "sampling_options": options}


#: Wrong requests, by name: each takes the request the worker was sent.
REQUEST_PERTURBATIONS = {"the sampling dropped": sampling_dropped}
