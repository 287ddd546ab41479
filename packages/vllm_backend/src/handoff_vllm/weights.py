"""The built-in model's weights, drawn from a seed with numpy: what handoff_vllm.tiny_model
writes for vLLM, and what handoff_vllm.fingerprint computes the model with, so that the
reference never comes from the deployment under test.

4 layers, 8 query heads sharing 2 KV heads (grouped-query attention, as real models do), head
size 64. The residual stream's dimensions: a constant 1 (the bias), a flag set on the anchor
word only, the parity the anchor head writes, thirteen fingerprint dimensions, and each
token's code, a random +1/-1 vector.

- The anchor head (layer 0, query head 0) decides the next token with the rule
  (handoff_vllm.rule): it attends from every position to the anchor alone, on the fastest
  rotary pair, which the linear RoPE scaling turns by pi a position, so at an even distance
  the anchor takes all the attention and at an odd one none; layer 0's gated MLP turns that 1
  or 0 into a switch that rotates the token's code, and the output head scores the rule's
  successor of the last token far above every other word.
- One print head reads each KV head of each layer (`PRINT_HEADS`): its query and its keys are
  random on every dimension of the head, so every token takes a share of its attention that
  depends on what it is, where it stands (on every rotary pair, fast and slow) and, from
  layer 1 on, on the parity of its distance to the anchor (layer 0's MLP rotated its code);
  its values are random projections of the token, and its output head reads every dimension.
  The anchor is a sink: its key on the slowest rotary pair scores it about e^`SINK` times any
  other token over every distance the context reaches, so each token's share is about
  1 / (e^SINK + n) at a context of n: a sum more than an average, so one token's weight does
  not fade as the context grows. Every key and every value a token holds in every layer and
  head therefore moves the thirteen fingerprint dimensions, which move every word's logit by
  a little, against a decision margin of over 10: the top token stays the rule's, while the
  log-probabilities of the others are a fingerprint of every token of the context, in order,
  and of every value of its KV cache (benchmarks/kv_search.py measures how far).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from handoff.word_tokenizer import VOCAB_SIZE
from handoff_vllm import rule

if TYPE_CHECKING:
    import numpy as np

HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 512, 2048, 4, 8, 2, 64
#: Query heads a KV head serves.
GROUP = HEADS // KV_HEADS
#: The residual stream's dimensions.
BIAS, FLAG, PARITY, PRINT, CODE = 0, 1, 2, slice(3, 16), slice(16, HIDDEN)
WIDTH = CODE.stop - CODE.start
#: The anchor's code is 0 on the code's first half (and larger on the rest, to keep its norm):
#: what the print heads' values read.
BLIND = WIDTH // 2
#: The anchor head's query and key sizes (a score of about 33), the gate's steepness, and the
#: output head's scale (the right token's logit).
QUERY_KEY, GATE, LOGIT = 16.0, 60.0, 40.0
#: The heads that print the context, (layer, query head): one on each KV head of each layer
#: (query head 1 shares KV head 0 with the anchor head in layer 0).
PRINT_HEADS = ((0, 1), (0, GROUP), *((n, h) for n in range(1, LAYERS) for h in (0, GROUP)))
#: A print head's score of a token: its spread (standard deviation) over tokens and positions,
#: and the size of its query on each rotary pair the sink does not stand on.
SCORE_SPREAD, QUERY_PAIR = 0.9, 16.0
#: The sink: its score, the slow rotary pairs it stands on, the anchor's key there, and the
#: ridge of the fit that keeps its query small (`sink_query`).
SINK, SINK_PAIRS, SINK_KEY, SINK_RIDGE = 7.5, range(26, HEAD_DIM // 2), 2.0, 1e-4
#: A print head's values, and the scale of what its output head writes and of what the
#: fingerprint dimensions add to each logit.
VALUE, PRINT_GAIN, PRINT_LOGIT = 1.0, 1.0, 4.0
#: How much of the anchor's flag (value dimension 0 of layer 0's KV head 0, which the sink
#: holds almost all of the attention on) print head (0, 1) writes, against its other values.
FLAG_READ = 1 / 4
RMS_EPS = 1e-6
ROPE_THETA = 10000.0
#: The fastest rotary pair turns by pi a position (vLLM and transformers divide positions by
#: the linear scaling factor).
ROPE_FACTOR = 1 / math.pi
#: The longest context the model serves (handoff_vllm.tiny_model), over which the sink holds.
CONTEXT_TOKENS = 4096


@dataclass(frozen=True)
class Flavour:
    """Which model of a seed: the output head's scale, and whether the rule's walk returns to a
    word two tokens later (`rule.returning`)."""

    name: str
    logit: float
    returning: bool = False


#: The model every case serves but the sampling ones: the rule's token leads by over 10 logits.
EXACT = Flavour("exact", LOGIT)
#: The sampling cases' model (cases.SAMPLINGS): the rule's token leads by about the penalties'
#: size, within the fingerprint's spread, and its outputs repeat, so a penalty on repeats or a
#: draw at a temperature changes them at almost every token. What it outputs is computed whole
#: (handoff_vllm.sampling); the scale is the one at which a successor counting its penalties
#: afresh gives another text after almost any number of tokens carried (benchmarks/RESULTS.md).
CLOSE = Flavour("close", 4.0, returning=True)


@dataclass(frozen=True)
class Layer:
    """One layer's attention, stored as torch's Linear stores it: (out, in)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray


@dataclass(frozen=True)
class Weights:
    """Every layer's attention, layer 0's MLP (the later ones write nothing) and the two ends
    of the model, float32 as written."""

    embed: np.ndarray
    layers: tuple[Layer, ...]
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray
    lm_head: np.ndarray


def rows(head: int) -> slice:
    return slice(head * HEAD_DIM, (head + 1) * HEAD_DIM)


def inverse_frequencies() -> np.ndarray:
    """Each rotary pair's turn a position, the linear scaling applied."""
    import numpy as np

    half = HEAD_DIM // 2
    return ROPE_THETA ** (-np.arange(half) / half) / ROPE_FACTOR


@cache
def recipe(seed: int, flavour: Flavour = EXACT) -> Weights:
    """The weights of `seed` in `flavour` (see above). numpy is imported here, not above:
    every process of handoff loads this backend's plugin, and most never build the model."""
    import numpy as np

    rng = np.random.default_rng(seed)
    code = rng.choice([-1.0, 1.0], (VOCAB_SIZE, WIDTH))
    code[rule.ANCHOR, :BLIND], code[rule.ANCHOR, BLIND:] = 0.0, code[rule.ANCHOR, BLIND:] * 2**0.5
    rotation, _ = np.linalg.qr(rng.standard_normal((WIDTH, WIDTH)))
    embed = np.zeros((VOCAB_SIZE, HIDDEN))
    embed[:, BIAS], embed[rule.ANCHOR, FLAG], embed[:, CODE] = 1.0, 1.0, code
    layers = [blank() for _ in range(LAYERS)]
    anchor_head(layers[0])
    for n, head in PRINT_HEADS:
        print_head(layers[n], head, rng)
    gate, up, down = switch(rotation)
    walk = rule.returning if flavour.returning else rule.successors
    even, odd = (np.array(m) for m in walk(seed))
    # The anchor's code is never rotated (`switch`), and it stands an even distance (0) from
    # itself: its unrotated code scores its even successor.
    odd[rule.ANCHOR], rotated = even[rule.ANCHOR], code @ rotation.T
    rotated[rule.ANCHOR] = 0.0
    output = np.zeros((VOCAB_SIZE, WIDTH))
    np.add.at(output, odd, code)
    np.add.at(output, even, rotated)
    lm_head = np.zeros((VOCAB_SIZE, HIDDEN))
    lm_head[:, CODE] = output * (flavour.logit / WIDTH)
    lm_head[:, PRINT] = rng.standard_normal((VOCAB_SIZE, PRINT.stop - PRINT.start)) * PRINT_LOGIT

    def f32(a: np.ndarray) -> np.ndarray:
        return a.astype(np.float32)

    written = tuple(Layer(*map(f32, (x.q, x.k, x.v, x.o))) for x in layers)
    return Weights(f32(embed), written, *map(f32, (gate, up, down, lm_head)))


def blank() -> Layer:
    import numpy as np

    kv = KV_HEADS * HEAD_DIM
    return Layer(
        np.zeros((HEADS * HEAD_DIM, HIDDEN)), np.zeros((kv, HIDDEN)), np.zeros((kv, HIDDEN)),
        np.zeros((HIDDEN, HEADS * HEAD_DIM)),
    )  # fmt: skip


def anchor_head(layer: Layer) -> None:
    """Query head 0 on KV head 0, rotary pair (0, 32): the anchor's flag, by the parity of the
    distance to it, into the parity dimension."""
    layer.q[0, BIAS] = layer.k[0, FLAG] = QUERY_KEY
    layer.v[0, FLAG], layer.o[PARITY, 0] = 1.0, 1.0


def print_head(layer: Layer, head: int, rng: np.random.Generator) -> None:
    """`head` of `layer` and the KV head it reads: see above. The query is the sink's on
    `SINK_PAIRS` and random on the other pairs; the keys are random on every dimension, each
    pair scaled to add the same share of `SCORE_SPREAD`, and the anchor's key adds the sink.
    The values read only the code's first `BLIND` dimensions, where the anchor's code is 0 in
    every layer, so the sink's value is 0 to the last bit in any arithmetic; value dimension 0
    of KV head 0 in layer 0 stays the anchor head's flag, which this head reads little of
    (`FLAG_READ`)."""
    import numpy as np

    half = HEAD_DIM // 2
    q, kv = rows(head), rows(head // GROUP)
    pairs = rng.standard_normal((2, half))
    pairs *= QUERY_PAIR / np.linalg.norm(pairs, axis=0)
    pairs[:, SINK_PAIRS] = sink_query().T
    layer.q[q, BIAS] = pairs.reshape(-1)
    per_pair = SCORE_SPREAD * math.sqrt(HEAD_DIM) / math.sqrt(half) / np.linalg.norm(pairs, axis=0)
    keys = rng.standard_normal((HEAD_DIM, WIDTH)) / math.sqrt(WIDTH)
    layer.k[kv, CODE] = keys * np.tile(per_pair, 2)[:, None]
    layer.k[[kv.start + p for p in SINK_PAIRS], FLAG] = SINK_KEY
    values = rng.standard_normal((HEAD_DIM, WIDTH)) * VALUE / math.sqrt(BLIND)
    values[:, BLIND:] = 0.0
    out = rng.standard_normal((PRINT.stop - PRINT.start, HEAD_DIM))
    if layer.v[kv.start, FLAG]:
        values[0], out[:, 0] = 0.0, out[:, 0] * FLAG_READ
    layer.v[kv, CODE] = values
    layer.o[PRINT, q] = out * PRINT_GAIN / math.sqrt(HEAD_DIM)


@cache
def sink_query() -> np.ndarray:
    """The query on each of `SINK_PAIRS` (pair, its two dimensions) under which the anchor's key
    (`SINK_KEY` on each pair's first dimension) scores `SINK` within a few hundredths over every
    distance from 0 to the longest context: a ridge fit of cosines and sines of those pairs'
    turns to a constant. A query (a, b) meets that key at a distance n with the score
    SINK_KEY (a cos(w n) - b sin(w n)) / sqrt(64)."""
    import numpy as np

    turns = inverse_frequencies()[list(SINK_PAIRS)]
    distance = np.arange(CONTEXT_TOKENS + HEAD_DIM, dtype=np.float64)
    basis = np.concatenate(
        [np.cos(np.outer(distance, turns)), np.sin(np.outer(distance, turns))], 1
    )
    normal = basis.T @ basis / len(distance) + SINK_RIDGE * np.eye(basis.shape[1])
    fit = np.linalg.solve(normal, basis.T @ np.ones(len(distance)) / len(distance))
    cos, sin = np.split(fit * SINK * math.sqrt(HEAD_DIM) / SINK_KEY, 2)
    return np.stack([cos, -sin], 1)


def switch(rotation: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Layer 0's gated MLP: where the parity dimension is 1, the code is rotated; never the
    anchor's, whose flag shuts the gate to below what float32 holds: its code stays what the
    embedding gives in every layer, 0 where the print heads' values read (the sink holds
    most of their attention, so a rounding left in its value would move every logit)."""
    import numpy as np

    gate, up = np.zeros((INTERMEDIATE, HIDDEN)), np.zeros((INTERMEDIATE, HIDDEN))
    gates = slice(0, WIDTH)
    gate[gates, PARITY], gate[gates, BIAS], gate[gates, FLAG] = GATE, -GATE / 2, -2 * GATE
    up[gates, CODE] = rotation - np.eye(WIDTH)
    parity = np.sqrt(HIDDEN / (2 + WIDTH))  # the anchor's value through its norm
    norm = np.sqrt((1 + parity**2 + WIDTH) / HIDDEN)  # a token's RMS at the MLP
    open_gate = GATE * (parity - 0.5) / norm**2  # silu's pass-through and up's 1/RMS
    down = np.zeros((HIDDEN, INTERMEDIATE))
    down[CODE, gates] = np.eye(WIDTH) / open_gate
    return gate, up, down
