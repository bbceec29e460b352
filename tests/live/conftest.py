"""Live-engine tests need the CPU build of vLLM (`make live-cpu`; `make test` installs it).

Without vllm they are skipped on a developer's machine, but fail in CI (CI=true), where the
live path must be proven for real.
"""

import importlib.util
import os

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def require_vllm() -> None:
    """Skip (locally) or fail (in CI) when vllm is not installed."""
    if HAVE_VLLM:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("vllm is not installed in CI: `make test` should have run `make live-cpu`")
    pytest.skip("vllm not installed (run `make live-cpu`)")
