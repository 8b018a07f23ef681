"""Shared test setup: offline hub, a private AGENTRL_HOME per run, hypothesis profiles, vLLM or skip.

Select a hypothesis profile with ``HYPOTHESIS_PROFILE=thorough`` for long, random fuzz runs;
the default ``ci`` profile is derandomized and keeps the whole suite within its time budget.
"""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import HealthCheck, settings

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Models built by tests go into a fresh cache, so a test run never depends on what a user built before.
os.environ["AGENTRL_HOME"] = os.environ.get("AGENTRL_TEST_HOME") or tempfile.mkdtemp(
    prefix="agentrl-test-home-"
)

# ci: derandomized, so a CI run is reproducible; thorough: random and long, to explore.
settings.register_profile(
    "ci", max_examples=50, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The vLLM environment's interpreter (``find_vllm_python``): what a test against a real vLLM asks for.

    Without one the test skips with the reason, unless ``AGENTRL_REQUIRE_VLLM=1`` (scripts/test.sh,
    so CI), where a missing vLLM is a failure instead.
    """
    from agentrl.engines.errors import EngineUnavailableError
    from agentrl.engines.launcher import find_vllm_python

    try:
        return find_vllm_python()
    except EngineUnavailableError as e:
        if os.environ.get("AGENTRL_REQUIRE_VLLM") == "1":
            pytest.fail(f"AGENTRL_REQUIRE_VLLM=1 but {e}")
        pytest.skip("vLLM is not set up (scripts/setup.sh --vllm)")
