"""A new environment in under 40 lines: reverse a word (single turn, exact-match reward).

python examples/reverse_env.py                      # check it, then play one gold episode
agentrl serve-env --import reverse_env --env reverse-v0 --port 8100   # (PYTHONPATH=examples)
"""

from __future__ import annotations

from typing import Any

from agentrl.envs import Env, StepResult, check_env, make, register
from agentrl.types import Message

WORDS = ["agent", "reward", "policy", "token", "episode", "gradient", "sandbox", "rollout"]


class ReverseEnv(Env):
    """Reply with the word spelled backwards inside <answer>...</answer>."""

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        self.word = WORDS[int(self.np_random.integers(len(WORDS)))]
        return [
            Message(role="user", content=f"Reverse the word '{self.word}'. Reply <answer>...</answer>.")
        ], {}

    def _step(self, action: Message) -> StepResult:
        reply = (action.content or "").split("<answer>")[-1].split("</answer>")[0].strip()
        return StepResult([], float(reply == self.word[::-1]), True, False, {"expected": self.word[::-1]})

    def oracle_action(self) -> Message:
        return Message(role="assistant", content=f"<answer>{self.word[::-1]}</answer>")


register("reverse-v0", ReverseEnv, description="single turn: reverse a word")

if __name__ == "__main__":
    print(check_env("reverse-v0").passed)
    env = make("reverse-v0")
    messages, _ = env.reset(seed=1)
    print(messages[0].content, "->", env.step(env.oracle_action()))
