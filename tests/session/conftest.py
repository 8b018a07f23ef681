"""Fixtures for the session tests: the models' tokenizers and real embedded engines, built once."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

FAMILY_MODELS = {
    "qwen2.5": "tiny-qwen2.5",
    "qwen3": "tiny-qwen3",
    "llama3": "tiny-llama3",
    "glm4": "tiny-glm4",
}
REALVOCAB_MODELS = ["tiny-qwen2.5-realvocab", "tiny-qwen3-realvocab"]
ALL_MODELS = [*FAMILY_MODELS.values(), "tiny", *REALVOCAB_MODELS]


class _Lazy:
    def __init__(self, make: Any) -> None:
        self._make = make
        self._items: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._items:
            self._items[name] = self._make(name)
        return self._items[name]

    def values(self) -> list[Any]:
        return list(self._items.values())


@pytest.fixture(scope="session")
def tokenizers() -> _Lazy:
    from agentrl.models import load_tokenizer

    return _Lazy(load_tokenizer)


@pytest.fixture(scope="session")
def engines() -> Iterator[_Lazy]:
    from agentrl.engines import HFEngine

    lazy = _Lazy(lambda name: HFEngine(name, device="cpu", seed=7))
    yield lazy
    for e in lazy.values():
        e.close()
