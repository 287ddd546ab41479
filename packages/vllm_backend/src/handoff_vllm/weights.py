"""The built-in model's weights, drawn from a seed with numpy: what handoff_vllm.tiny_model
writes for vLLM, and what handoff_vllm.fingerprint computes the model with, so that the
reference never comes from the deployment under test.

Only layer 0 writes to the residual stream. Its dimensions: a constant 1 (the bias), a flag set
on the anchor word only, the parity the anchor head writes, thirteen fingerprint dimensions, and
each token's code, a random +1/-1 vector. Two heads of layer 0 write:
- head 0 decides the next token (handoff_vllm.rule): it attends from every position to the
  anchor alone, on the fastest rotary pair, which the linear RoPE scaling turns by pi a
  position, so at an even distance the anchor takes all the attention and at an odd one none;
  the gated MLP turns that 1 or 0 into a switch that rotates the token's code, and the output
  head scores the rule's successor of the last token far above every other word;
- head 1 fingerprints the whole context: its query is the bias, its keys and values random
  projections of each token's code, so every token takes a share of its attention that depends
  on what it is and where it stands: by the parity of its distance, on one dimension of the
  fastest rotary pair (cos(pi n), exact however far, as the angle's float32 rounding is not),
  and by its distance, on eight slow pairs (a block moved by an even number of positions).
  What it writes moves every word's logit by up to a few logits, against a decision margin
  of over 15: the top token stays the rule's, while the log-probabilities of the others are a
  fingerprint of every token of the context, in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from handoff.word_tokenizer import VOCAB_SIZE
from handoff_vllm import rule

if TYPE_CHECKING:
    import numpy as np

HIDDEN, INTERMEDIATE, HEADS, HEAD_DIM = 512, 2048, 8, 64
#: The residual stream's dimensions.
BIAS, FLAG, PARITY, PRINT, CODE = 0, 1, 2, slice(3, 16), slice(16, HIDDEN)
WIDTH = CODE.stop - CODE.start
#: The anchor head's query and key sizes (a score of about 33), the gate's steepness, and the
#: output head's scale (the right token's logit).
QUERY_KEY, GATE, LOGIT = 16.0, 60.0, 40.0
#: The fingerprint head's slow rotary pairs, the scale of what it adds to each logit, and its
#: query on the fastest pair (a score of about +-1 by the distance's parity).
PRINT_PAIRS, PRINT_LOGIT, PARITY_QUERY = range(10, 18), 4.0, 4.0
RMS_EPS = 1e-6
ROPE_THETA = 10000.0


@dataclass(frozen=True)
class Flavour:
    """Which model of a seed: the output head's scale, and whether the rule's walk returns to a
    word two tokens later (`rule.returning`)."""

    name: str
    logit: float
    returning: bool = False


#: The model every case serves but the sampling ones: the rule's token leads by over 15 logits.
EXACT = Flavour("exact", LOGIT)
#: The sampling cases' model (cases.SAMPLINGS): the rule's token leads by about the penalties'
#: size, within the fingerprint's spread, and its outputs repeat, so a penalty on repeats or a
#: draw at a temperature changes them at almost every token. What it outputs is computed whole
#: (handoff_vllm.sampling); the scale is the one at which a successor counting its penalties
#: afresh gives another text after almost any number of tokens carried (benchmarks/RESULTS.md).
CLOSE = Flavour("close", 4.0, returning=True)


@dataclass(frozen=True)
class Weights:
    """Layer 0 and the two ends of the model, float32 as written. Projections are stored as
    torch's Linear stores them: (out, in)."""

    embed: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray
    lm_head: np.ndarray


@cache
def recipe(seed: int, flavour: Flavour = EXACT) -> Weights:
    """The weights of `seed` in `flavour` (see above). numpy is imported here, not above:
    every process of handoff loads this backend's plugin, and most never build the model."""
    import numpy as np

    rng = np.random.default_rng(seed)
    code = rng.choice([-1.0, 1.0], (VOCAB_SIZE, WIDTH))
    rotation, _ = np.linalg.qr(rng.standard_normal((WIDTH, WIDTH)))
    embed = np.zeros((VOCAB_SIZE, HIDDEN))
    embed[:, BIAS], embed[rule.ANCHOR, FLAG], embed[:, CODE] = 1.0, 1.0, code
    q, k, v, o = (np.zeros((HIDDEN, HIDDEN)) for _ in range(4))
    q[0, BIAS] = k[0, FLAG] = QUERY_KEY  # head 0, rotary pair (0, 32): the fastest
    v[0, FLAG], o[PARITY, 0] = 1.0, 1.0
    dims = [HEAD_DIM + d for pair in PRINT_PAIRS for d in (pair, pair + HEAD_DIM // 2)]
    q[dims, BIAS] = rng.standard_normal(len(dims))
    k[dims, CODE] = rng.standard_normal((len(dims), WIDTH)) / np.sqrt(WIDTH)
    # The fastest pair on one of its dimensions only: q k cos(pi n), n the distance.
    q[HEAD_DIM, BIAS] = PARITY_QUERY
    k[HEAD_DIM, CODE] = rng.standard_normal(WIDTH) / np.sqrt(WIDTH)
    v[HEAD_DIM : 2 * HEAD_DIM, CODE] = rng.standard_normal((HEAD_DIM, WIDTH)) / np.sqrt(WIDTH)
    o[PRINT, HEAD_DIM : 2 * HEAD_DIM] = rng.standard_normal((13, HEAD_DIM)) / np.sqrt(HEAD_DIM)
    gate, up = np.zeros((INTERMEDIATE, HIDDEN)), np.zeros((INTERMEDIATE, HIDDEN))
    gates = slice(0, WIDTH)
    gate[gates, PARITY], gate[gates, BIAS] = GATE, -GATE / 2
    up[gates, CODE] = rotation - np.eye(WIDTH)
    parity = np.sqrt(HIDDEN / (2 + WIDTH))  # the anchor's value through its norm
    norm = np.sqrt((1 + parity**2 + WIDTH) / HIDDEN)  # a token's RMS at the MLP
    open_gate = GATE * (parity - 0.5) / norm**2  # silu's pass-through and up's 1/RMS
    down = np.zeros((HIDDEN, INTERMEDIATE))
    down[CODE, gates] = np.eye(WIDTH) / open_gate
    walk = rule.returning if flavour.returning else rule.successors
    even, odd = (np.array(m) for m in walk(seed))
    output = np.zeros((VOCAB_SIZE, WIDTH))
    np.add.at(output, odd, code)
    np.add.at(output, even, code @ rotation.T)
    lm_head = np.zeros((VOCAB_SIZE, HIDDEN))
    lm_head[:, CODE] = output * (flavour.logit / WIDTH)
    lm_head[:, PRINT] = rng.standard_normal((VOCAB_SIZE, 13)) * PRINT_LOGIT
    arrays = (embed, q, k, v, o, gate, up, down, lm_head)
    return Weights(*(a.astype(np.float32) for a in arrays))
