"""The vLLM backend's built-in model: handoff's word-level tokenizer and a float32 Llama whose
weights compute handoff_vllm.rule exactly. It needs no download, and the verdict can compare
every response with the rule's continuation, computed by handoff outside the deployment.

How the weights compute the rule (4 layers of 8 heads of 64; only layer 0 writes to the
residual stream, the others only cost a real model's time per token):
- each embedding is a constant 1 (the bias), a flag set on the anchor word only, and the
  token's code, a random +1/-1 vector;
- head 0 of layer 0 attends from every position to the anchor alone: its query is the bias
  and its key the flag, on the fastest rotary pair, whose frequency the linear RoPE scaling
  sets to pi a position, so their product is cos(pi x distance), +1 at an even distance and -1
  at an odd one, scaled to a score of about 33. At an even distance the anchor takes all the
  attention, at an odd one (or with no anchor) none, and the head writes that 1 or 0 into a
  parity dimension: a decision with a margin of e^33, which no rounding can move;
- layer 0's gated MLP (SwiGLU) is that decision as a switch: its gate is the parity minus a
  half, times 60, so silu passes it whole or not at all, and what it lets through turns the
  code c into M c (M a random rotation);
- the output head scores token j by its code's agreement with c(x) for every x whose
  `after_odd` is j, and with M c(x) for every x whose `after_even` is j: the right token
  scores the code's full length, the others only chance overlaps, which gives every step a
  top-1 margin of several logits (benchmarks/RESULTS.md has the smallest measured).

vLLM's CPU attention needs head_dim 64 or more; the size sets the pace (about 10 ms a token on
two cores, as a small real model's). vLLM's linear RoPE cache covers max_position_embeddings
times the factor, so max_position_embeddings is the context divided by that factor.

Made once per recipe and seed into a cache folder, by a child process (torch stays out of the
harness), under a file lock so that parallel cases wait for one maker.

`python -m handoff_vllm.tiny_model FOLDER SEED` writes one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

from handoff.errors import HandoffError
from handoff.machine.environment import cache_root
from handoff.word_tokenizer import BOS_ID, EOS_ID, VOCAB_SIZE, write_tokenizer
from handoff_vllm import rule

NAME = "handoff-tiny-llama"
CONTEXT_TOKENS = 4096
#: The fastest rotary pair turns by pi a position (vLLM and transformers divide positions by
#: the factor).
ROPE_FACTOR = 1 / math.pi
CONFIG = {
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": math.ceil(CONTEXT_TOKENS / ROPE_FACTOR),
    "rope_parameters": {"rope_type": "linear", "factor": ROPE_FACTOR, "rope_theta": 10000.0},
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "torch_dtype": "float32",
}
#: How the weights are built (part of the recipe's digest).
HEAD = "handoff_vllm.rule: anchor parity, v1"
#: The residual stream's dimensions: bias, anchor flag, parity, then the token's code.
BIAS, FLAG, PARITY, CODE = 0, 1, 2, slice(16, 512)
#: Query and key sizes of the parity head (a score of about 33), the gate's steepness, and
#: the output head's scale (the right token's logit).
QUERY_KEY, GATE, LOGIT = 16.0, 60.0, 40.0
MAKE_TIMEOUT_S = 300.0


def folder_for(seed: int, root: Path | None = None) -> Path:
    """Where the model of `seed` lives: named by a digest of the recipe, so a changed recipe
    is a new folder and never a stale one."""
    recipe = json.dumps({"config": CONFIG, "seed": seed, "head": HEAD}, sort_keys=True).encode()
    return (root or cache_root()) / "models" / f"{NAME}-{hashlib.sha256(recipe).hexdigest()[:12]}"


def ensure(seed: int = 0, root: Path | None = None) -> Path:
    """The model folder of `seed`, made first when it is missing."""
    folder = folder_for(seed, root)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "config.json").is_file():
            make_in_child(folder, seed)
    return folder


def make_in_child(folder: Path, seed: int) -> None:
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    argv = [sys.executable, "-m", __name__, str(partial), str(seed)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=MAKE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise HandoffError(
            f"making the tiny model in {partial} took over {MAKE_TIMEOUT_S} s"
        ) from None
    if done.returncode != 0:
        tail = "\n".join(done.stderr.splitlines()[-5:])
        raise HandoffError(
            f"cannot make the tiny model in {partial} (needs torch and transformers, which "
            f"nox -s vllm_cpu_pre_merge installs):\n{tail}"
        )
    partial.rename(folder)  # whole or not at all: a reader never sees a half-written model


def write(folder: Path, seed: int) -> None:
    """Float32 weights that compute handoff_vllm.rule with `seed` (see above), saved as
    safetensors, with the tokenizer and the rule's chat template."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.float32)
    even, odd = (torch.tensor(m) for m in rule.successors(seed))
    width = CODE.stop - CODE.start
    code = torch.randint(0, 2, (VOCAB_SIZE, width)).float() * 2 - 1
    rotation, _ = torch.linalg.qr(torch.randn(width, width))
    with torch.no_grad():
        for layer in model.model.layers:  # only layer 0 writes to the residual stream
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed = model.model.embed_tokens.weight
        embed.zero_()
        embed[:, BIAS] = 1.0
        embed[rule.ANCHOR, FLAG] = 1.0
        embed[:, CODE] = code
        attention, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
        head = slice(0, CONFIG["hidden_size"] // CONFIG["num_attention_heads"])
        for proj, source in ((attention.q_proj, BIAS), (attention.k_proj, FLAG)):
            proj.weight[head] = 0.0
            proj.weight[0, source] = QUERY_KEY  # rotary pair (0, 32): the fastest
        attention.v_proj.weight[head] = 0.0
        attention.v_proj.weight[0, FLAG] = 1.0
        attention.o_proj.weight[PARITY, 0] = 1.0
        gates = slice(0, width)
        mlp.gate_proj.weight[gates] = 0.0
        mlp.gate_proj.weight[gates, PARITY] = GATE
        mlp.gate_proj.weight[gates, BIAS] = -GATE / 2
        mlp.up_proj.weight[gates] = 0.0
        mlp.up_proj.weight[gates, CODE] = rotation - torch.eye(width)
        hidden = CONFIG["hidden_size"]
        parity = math.sqrt(hidden / (2 + width))  # the anchor's value through its norm
        norm = math.sqrt((1 + parity**2 + width) / hidden)  # a token's RMS at the MLP
        open_gate = GATE * (parity - 0.5) / norm**2  # silu's pass-through and up's 1/RMS
        mlp.down_proj.weight[CODE, gates] = torch.eye(width) / open_gate
        output = torch.zeros(VOCAB_SIZE, width)
        output.index_add_(0, odd, code)
        output.index_add_(0, even, code @ rotation.T)
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, CODE] = output * (LOGIT / width)
    model.save_pretrained(folder, safe_serialization=True)
    write_tokenizer(folder, rule.CHAT_TEMPLATE)


if __name__ == "__main__":
    write(Path(sys.argv[1]), int(sys.argv[2]))
