"""Every test file of the project is collected. Dynamo's wheel registers a pytest plugin per
engine that leaves out, with no word, any `test_vllm_*.py` (`test_sglang_*.py`, ...) where that
engine cannot be imported; the tests of the vLLM backend run without vLLM, so pyproject.toml
blocks those plugins."""

from pathlib import Path

import pytest

TESTS = Path(__file__).parents[1]


@pytest.mark.parametrize(
    "path", sorted(TESTS.rglob("test_*.py")), ids=lambda p: str(p.relative_to(TESTS))
)
def test_no_plugin_leaves_the_file_out(path, request):
    assert not request.config.hook.pytest_ignore_collect(
        collection_path=path, config=request.config
    )
