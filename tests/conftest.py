"""Shared test setup: offline hub, a private AGENTRL_HOME per run, hypothesis profiles.

Select a hypothesis profile with ``HYPOTHESIS_PROFILE=thorough`` for long, random fuzz runs;
the default ``ci`` profile is derandomized and keeps the whole suite within its time budget.
"""

from __future__ import annotations

import os
import tempfile

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
