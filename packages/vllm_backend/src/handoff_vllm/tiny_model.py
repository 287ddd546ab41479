"""The vLLM backend's built-in model: handoff's word-level tokenizer and a float32 Llama with
the weights of handoff_vllm.weights, which say how they compute handoff_vllm.rule's next token
and a fingerprint of the whole context in the other words' log-probabilities. It needs no
download, and the verdict compares every response with the rule's continuation and with
handoff_vllm.fingerprint's log-probabilities, both computed by handoff outside the deployment.

4 layers of 8 query heads on 2 KV heads of 64: every layer's attention writes the context's
fingerprint, only layer 0's MLP writes (the later ones cost a real model's time per token).
vLLM's CPU attention needs head_dim 64 or more; the size sets the pace (about 10 ms a token on
two cores, as a small real model's). vLLM's linear RoPE cache
covers max_position_embeddings times the factor, so max_position_embeddings is the context
divided by that factor.

Made once per recipe and seed into a cache folder, by a child process (torch stays out of the
harness), under a file lock so that parallel cases wait for one maker.

`python -m handoff_vllm.tiny_model FOLDER SEED FLAVOUR` writes one (`exact` or `close`).
"""

from __future__ import annotations

import dataclasses
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
from handoff_vllm import rule, weights
from handoff_vllm.weights import Flavour

NAME = "handoff-tiny-llama"
#: How many log-probabilities a case asks of the model for each token (handoff_vllm.fingerprint).
TOP_LOGPROBS = 5
CONTEXT_TOKENS = weights.CONTEXT_TOKENS
#: The fastest rotary pair turns by pi a position (vLLM and transformers divide positions by
#: the factor).
ROPE_FACTOR = weights.ROPE_FACTOR
CONFIG = {
    "hidden_size": weights.HIDDEN,
    "intermediate_size": weights.INTERMEDIATE,
    "num_hidden_layers": weights.LAYERS,
    "num_attention_heads": weights.HEADS,
    "num_key_value_heads": weights.KV_HEADS,
    "head_dim": weights.HEAD_DIM,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": math.ceil(CONTEXT_TOKENS / ROPE_FACTOR),
    "rope_parameters": {
        "rope_type": "linear",
        "factor": ROPE_FACTOR,
        "rope_theta": weights.ROPE_THETA,
    },
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "torch_dtype": "float32",
}
MAKE_TIMEOUT_S = 300.0


FLAVOURS = {f.name: f for f in (weights.EXACT, weights.CLOSE)}


def folder_for(seed: int, root: Path | None = None, flavour: Flavour = weights.EXACT) -> Path:
    """Where the model of `seed` lives: named by a digest of its configuration and of the
    weights themselves, so a changed recipe is a new folder and never a stale one."""
    digest = hashlib.sha256(json.dumps(CONFIG, sort_keys=True).encode())
    recipe = weights.recipe(seed, flavour)
    for array in (recipe.embed, *(a for x in recipe.layers for a in dataclasses.astuple(x))):
        digest.update(array.tobytes())
    for array in (recipe.gate, recipe.up, recipe.down, recipe.lm_head):
        digest.update(array.tobytes())
    return (root or cache_root()) / "models" / f"{NAME}-{digest.hexdigest()[:12]}"


def ensure(seed: int = 0, root: Path | None = None, flavour: Flavour = weights.EXACT) -> Path:
    """The model folder of `seed` in `flavour`, made first when it is missing."""
    folder = folder_for(seed, root, flavour)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "config.json").is_file():
            make_in_child(folder, seed, flavour)
    return folder


def make_in_child(folder: Path, seed: int, flavour: Flavour) -> None:
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    argv = [sys.executable, "-m", __name__, str(partial), str(seed), flavour.name]
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


def write(folder: Path, seed: int, flavour: Flavour = weights.EXACT) -> None:
    """handoff_vllm.weights of `seed` in `flavour` in a Llama, saved as float32 safetensors,
    with the tokenizer and the rule's chat template."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.float32)
    recipe = weights.recipe(seed, flavour)
    first = model.model.layers[0].mlp
    places = {
        model.model.embed_tokens: recipe.embed,
        first.gate_proj: recipe.gate,
        first.up_proj: recipe.up,
        first.down_proj: recipe.down,
        model.lm_head: recipe.lm_head,
    }
    for layer, written in zip(model.model.layers, recipe.layers, strict=True):
        attention = layer.self_attn
        places.update({
            attention.q_proj: written.q, attention.k_proj: written.k,
            attention.v_proj: written.v, attention.o_proj: written.o,
        })  # fmt: skip
    with torch.no_grad():
        for later in model.model.layers[1:]:  # only layer 0's MLP writes to the residual stream
            later.mlp.down_proj.weight.zero_()
        for module, array in places.items():
            module.weight.copy_(torch.from_numpy(array))
    model.save_pretrained(folder, safe_serialization=True)
    write_tokenizer(folder, rule.CHAT_TEMPLATE)


if __name__ == "__main__":
    write(Path(sys.argv[1]), int(sys.argv[2]), FLAVOURS[sys.argv[3]])
