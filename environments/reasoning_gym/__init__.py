"""reasoning-gym's task families as envs: ``reasoning-gym:NAME`` resolves to one (see env.py).

The namespace is registered here without importing reasoning-gym (an optional dependency): a
reference imports it, registers ``reasoning-gym-NAME-v0`` and returns that id.
"""

from agentrl.envs.namespaces import register_namespace
from environments.reasoning_gym.env import resolve_family

register_namespace(
    "reasoning-gym",
    resolve_family,
    description="reasoning-gym's 100+ procedural task families, one env each (e.g. "
    "reasoning-gym:leg_counting; knobs via --env-kwargs; pip install 'agentrl[reasoning-gym]')",
)
