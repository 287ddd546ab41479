"""Loaded by a vLLM decode worker whose PYTHONPATH holds this folder (after `nixl_polled`, whose
`sitecustomize` imports this one), with `HANDOFF_CORRUPT_KV` naming a corruption: the KV the
worker receives over NIXL is made wrong inside its engine, as a transfer with wrong offsets
would have written it, so that a kv_transfer case must fail by its log-probabilities.

The hook is `NixlBaseConnectorWorker.get_transfer_results` (vLLM's NIXL connector,
nixl/base_worker.py), which the engine's model runner calls every step: the requests it reports
in `finished_recving` have their reads done (NIXL's transfer state is DONE, so the bytes are in
the KV cache: on a CPU, NIXL reads straight into it, with no host buffer), and the scheduler
hands them to decode only on a later step. So each corruption lands after the transfer and
before anything reads it. The KV cache of a layer is [blocks, KV heads, block tokens, K and V]
(the CPU attention's LBHNC layout). Each corruption is logged to stderr (the worker's log):
"handoff-test: corrupted KV: <kind>: ..." with the request, layer, head and blocks.

Layer 0 and block 0 are left alone as targets: they hold the model's anchor head and its anchor
token (handoff_vllm.weights), whose loss would change the text as well as the fingerprint. The
last received block is never a source: only its prompt tokens are filled.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import re
import sys

WORKER = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"
#: The layer corrupted, the layer whose data it is given, the block corrupted, the block whose
#: data it is given.
LAYER, OTHER_LAYER, BLOCK, OTHER_BLOCK = 1, 2, 1, 2


def log(line: str) -> None:
    print(f"handoff-test: {line} (pid {os.getpid()})", file=sys.stderr, flush=True)


def by_layer(worker) -> list:
    """The worker's KV cache tensors in layer order ("model.layers.N.self_attn.attn")."""
    caches = worker.device_kv_caches
    return [caches[name] for name in sorted(caches, key=lambda n: int(re.findall(r"\d+", n)[0]))]


def received(meta) -> list[int]:
    """The KV cache blocks the transfer wrote: the local blocks the remote ones were read into."""
    local = list(meta.local_physical_block_ids[0])
    return local[: len(meta.remote.block_ids[0])] if meta.remote is not None else local


def a_layer(caches, blocks, earlier) -> str:
    caches[LAYER][blocks] = caches[OTHER_LAYER][blocks]
    return f"layer {LAYER} of its {len(blocks)} blocks given layer {OTHER_LAYER}'s data"


def a_head(caches, blocks, earlier) -> str:
    cache = caches[LAYER]
    assert cache.shape[1] == 2, cache.shape
    cache[blocks] = cache[blocks][:, [1, 0]]
    return f"KV heads 0 and 1 of layer {LAYER} swapped in its {len(blocks)} blocks"


def a_block(caches, blocks, earlier) -> str:
    for cache in caches:
        cache[blocks[BLOCK]].copy_(cache[blocks[OTHER_BLOCK]])
    return (
        f"block {BLOCK} (id {blocks[BLOCK]}) of all {len(caches)} layers given block "
        f"{OTHER_BLOCK}'s (id {blocks[OTHER_BLOCK]})"
    )


def another_requests_block(caches, blocks, earlier) -> str | None:
    """A block the worker received for an earlier request, at the same position where its data
    differ (another prompt), else at the nearest later position that does (the same prompt:
    a warm-up's block there would be the right one)."""
    if earlier is None:
        return None
    earlier_id, kept = earlier
    for at in range(BLOCK, len(kept[0]) - 1):
        if any(not k[at].equal(c[blocks[BLOCK]]) for k, c in zip(kept, caches, strict=True)):
            for k, cache in zip(kept, caches, strict=True):
                cache[blocks[BLOCK]].copy_(k[at])
            return (
                f"block {BLOCK} (id {blocks[BLOCK]}) of all {len(caches)} layers given block "
                f"{at} of earlier request {earlier_id}"
            )
    return None


CORRUPTIONS = {
    "a layer": a_layer,
    "a head": a_head,
    "a block": a_block,
    "another request's block": another_requests_block,
}


def corrupting(get_transfer_results, corrupt, kind: str):
    """`get_transfer_results` that corrupts each received request's KV before returning."""
    earlier = None

    def corrupted(self):
        nonlocal earlier
        pending = dict(self._recving_metadata)
        results = get_transfer_results(self)
        for req_id in sorted(results.finished_recving - results.failed_recving):
            caches, blocks = by_layer(self), received(pending[req_id])
            if len(blocks) <= OTHER_BLOCK + 1:
                log(f"corrupting KV: {req_id} has {len(blocks)} blocks, too few to corrupt")
                continue
            kept = [cache[blocks].clone() for cache in caches]
            did = corrupt(caches, blocks, earlier)
            earlier = (req_id, kept)
            if did is None:
                log(f"corrupting KV: {kind}: kept {len(blocks)} blocks of {req_id} for later")
            else:
                log(f"corrupted KV: {kind}: request {req_id}: {did}")
        return results

    return corrupted


class _Corrupting(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != WORKER:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        execute = spec.loader.exec_module
        kind = os.environ["HANDOFF_CORRUPT_KV"]

        def exec_module(module):
            execute(module)
            worker = module.NixlBaseConnectorWorker
            worker.get_transfer_results = corrupting(
                worker.get_transfer_results, CORRUPTIONS[kind], kind
            )
            log(f"corrupting KV: {kind}: {WORKER} patched")

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("HANDOFF_CORRUPT_KV"):
    sys.meta_path.insert(0, _Corrupting())
