"""The vLLM backend's built-in model: handoff's word-level tokenizer and a float32 Llama whose
weights come from a fixed seed. It needs no download, and at temperature 0 it answers the same
request with the same tokens every time, before and after a migration.

Purely random weights are not enough for that: their logits are nearly flat, so the argmax
sits on near-ties, and a migrated request, whose prefix the new worker computes in one prefill
instead of token by token, flipped one (the migrated text departed from the baseline at token
85 of 512, and at token 2,621 of 3,000, each time inside a repeated-token loop). So the weights
are random where they do not decide the next token (embeddings, attention and MLP inputs) and
built where they do: attention and MLP write nothing back to the residual stream (their output
projections are zero), and the output head maps each token to its successor in a random
permutation of the vocabulary, drawn from the seed, with a margin of about sqrt(hidden) over
every other token. The output then walks the permutation, every token different from the last,
so a token lost or repeated at the migration shows at once, and another seed gives another walk.

vLLM's CPU attention needs head_dim 64 or more (it refused 16). The size sets the pace: with
hidden 128 in 2 layers a token took 3.5 ms, so a request was over before the harness, sharing
two cores with three workers, had seen it in flight; 21 M parameters (84 MB) make a token take
about 10 ms, as a small real model's would.

Made once per recipe and seed into a cache folder, by a child process (torch stays out of the
harness), under a file lock so that parallel cases wait for one maker.

`python -m handoff_vllm.tiny_model FOLDER SEED` writes one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from handoff.errors import HandoffError
from handoff.word_tokenizer import BOS_ID, EOS_ID, VOCAB_SIZE, write_tokenizer

NAME = "handoff-tiny-llama"
CONFIG = {
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 4096,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "torch_dtype": "float32",
}
#: How the output head is built (part of the recipe's digest).
HEAD = "successor in a seeded permutation"
CACHE_ENV = "HANDOFF_CACHE"
MAKE_TIMEOUT_S = 300.0


def cache_root() -> Path:
    """HANDOFF_CACHE, else handoff's folder in the user's cache (XDG_CACHE_HOME)."""
    if chosen := os.environ.get(CACHE_ENV):
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "handoff"


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
    """Float32 weights from `seed` (see above), saved as safetensors, with the tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:  # the residual stream carries the token's embedding
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embeddings = model.model.embed_tokens.weight
        successor = torch.randperm(CONFIG["vocab_size"])
        unit = embeddings / embeddings.norm(dim=1, keepdim=True)
        model.lm_head.weight[successor] = unit * CONFIG["hidden_size"] ** 0.5
    model.save_pretrained(folder, safe_serialization=True)
    write_tokenizer(folder)


if __name__ == "__main__":
    write(Path(sys.argv[1]), int(sys.argv[2]))
