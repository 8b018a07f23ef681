"""Train the tiny model on countdown from Python: the same run as `agentrl train --env countdown`.

    python examples/train_countdown.py            # defaults (about 4 minutes on 2 CPU cores)
    python examples/train_countdown.py --quick    # a 1-minute smoke run on an even smaller model

Any option of `agentrl train --help` can be passed to ``resolve`` by its field name.
"""

from __future__ import annotations

import sys

from agentrl.trainer.config import resolve
from agentrl.trainer.loop import train


def main() -> int:
    quick = "--quick" in sys.argv
    cfg = resolve(
        env="countdown",
        **({"model": "tiny-qwen3", "steps": 5, "sft_steps": 20, "eval_episodes": 16} if quick else {}),
    )
    summary = train(cfg)
    print(
        f"eval reward: {summary.eval_start:.3f} -> {summary.eval_end:.3f}; checkpoint: {summary.final_model}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
