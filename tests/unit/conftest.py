"""Fixtures the unit tests of the GPU backends share."""

import importlib
import sys
from types import ModuleType, SimpleNamespace

import pytest
from hypothesis import settings

# No deadline for any example: twelve workers share two cores here, and a deadline is a timing
# assertion (an example took 327 ms against Hypothesis' 200 ms default in one such run).
settings.register_profile("handoff", deadline=None)
settings.load_profile("handoff")


@pytest.fixture
def dynamo_groups(monkeypatch):
    """Dynamo's flag groups per backend. `dynamo.trtllm.backend_args` imports
    `tensorrt_llm.llmapi.BuildConfig` only to read four defaults
    (`BuildConfig.model_fields[name].default`); TensorRT-LLM needs a GPU, so a stand-in module
    with those four fields is put in `sys.modules` for this test only, and Dynamo's real
    TRT-LLM flag definitions are imported against it."""
    runtime = importlib.import_module("dynamo.common.configuration.groups.runtime_args")
    vllm_args = importlib.import_module("dynamo.vllm.backend_args")
    sglang_args = importlib.import_module("dynamo.sglang.backend_args")
    fields = {"max_batch_size": 2048, "max_num_tokens": 8192, "max_seq_len": None,
              "max_beam_width": 1}  # fmt: skip
    build_config = type(
        "BuildConfig",
        (),
        {"model_fields": {k: SimpleNamespace(default=v) for k, v in fields.items()}},
    )
    package, llmapi = ModuleType("tensorrt_llm"), ModuleType("tensorrt_llm.llmapi")
    llmapi.BuildConfig = build_config
    package.llmapi = llmapi
    monkeypatch.setitem(sys.modules, "tensorrt_llm", package)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", llmapi)
    sys.modules.pop("dynamo.trtllm.backend_args", None)
    trtllm_args = importlib.import_module("dynamo.trtllm.backend_args")
    yield {
        "runtime": runtime.DynamoRuntimeArgGroup,
        "vllm": vllm_args.DynamoVllmArgGroup,
        "sglang": sglang_args.DynamoSGLangArgGroup,
        "trtllm": trtllm_args.DynamoTrtllmArgGroup,
    }
    sys.modules.pop("dynamo.trtllm.backend_args", None)  # it holds the stand-in
