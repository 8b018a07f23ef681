"""Every ``agentrl`` command the README shows parses, and every ``train`` one resolves to a valid config.

Running them all is the CI's and the demos' job (they take minutes each); this catches the
cheap mistakes that make a copied command fail at once: a renamed flag, a value the config
refuses, a flag combination that needs another.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from agentrl.cli import build_parser
from agentrl.trainer.config import resolve

README = Path(__file__).resolve().parents[1] / "README.md"


def _commands() -> list[list[str]]:
    """The argv (after ``agentrl``) of each agentrl command in the README's bash blocks."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            while words:  # `a && b`: each command on its own
                cut = words.index("&&") if "&&" in words else len(words)
                cmd, words = words[:cut], words[cut + 1 :]
                if cmd[:1] == ["torchrun"] and "agentrl.cli" in cmd:
                    cmd = ["agentrl", *cmd[cmd.index("agentrl.cli") + 1 :]]
                if cmd and cmd[0] in ("agentrl", ".venv/bin/agentrl"):
                    out.append(cmd[1:])
    return out


def test_the_readme_shows_commands() -> None:
    cmds = _commands()
    assert len(cmds) >= 10 and ["train", "--env", "countdown"] in cmds, cmds


@pytest.mark.parametrize("argv", _commands(), ids=shlex.join)
def test_a_readme_command_parses_and_its_config_resolves(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    if argv[0] in ("train", "sft", "eval"):
        resolve(args)  # raises ConfigError naming the field if the flags do not fit together
