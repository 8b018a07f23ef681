"""SGLangEngine's adapter path against agentrl's own engine server (``agentrl serve-engine``'s app over
an HFEngine on the tiny catalogue model): ``/load_lora_adapter`` round trips, in-process, no GPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from conftest import lora_adapter, tiny_qwen3

from agentrl.engines import HFEngine, run_sync
from agentrl.engines.errors import EngineRequestError, WeightUpdateError
from agentrl.engines.protocol import Generation
from agentrl.engines.server import create_app
from agentrl.engines.sglang import ADAPTER_NAME, SGLangEngine
from agentrl.httpkit import BackgroundServer
from agentrl.models import load_model, resolve
from agentrl.types import SamplingParams

PROMPT = [5, 6, 7, 8, 9]
PARAMS = SamplingParams(max_new_tokens=12, temperature=1.0, seed=3)


def _max_diff(model: torch.nn.Module, g: Generation) -> float:
    ids = torch.tensor([PROMPT + g.output_ids])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0].float(), -1)
    scored = [lp[len(PROMPT) - 1 + i, t].item() for i, t in enumerate(g.output_ids)]
    return max(abs(a - b) for a, b in zip(scored, g.logprobs, strict=True))


def _peft(path: Path) -> torch.nn.Module:
    from peft import PeftModel

    return PeftModel.from_pretrained(load_model(resolve("tiny")).float().eval(), str(path)).eval()


@pytest.fixture
def served() -> Iterator[tuple[str, HFEngine]]:
    engine = HFEngine(load_model(resolve("tiny")).float().eval(), device="cpu", stop_on_eos=False)
    try:
        with BackgroundServer(create_app(engine)) as srv:
            yield srv.url, engine
    finally:
        engine.close()


def test_sglang_client_pushes_adapters_into_the_engine_server(
    served: tuple[str, HFEngine], tmp_path: Path
) -> None:
    url, engine = served
    a1, a2 = lora_adapter(tmp_path / "a1", 1), lora_adapter(tmp_path / "a2", 2)
    client = SGLangEngine(url, retries=0, lora_rank=8)
    try:
        assert client.capabilities.adapter
        base = run_sync(client.generate(PROMPT, PARAMS), timeout_s=60, what="generate")
        assert run_sync(client.update_adapter_from_path(a1, version=3), timeout_s=60, what="update") == 3
        assert engine.weight_version == 3
        first = run_sync(client.generate(PROMPT, PARAMS), timeout_s=60, what="generate")
        assert first.weight_versions == [3] * len(first.output_ids)
        assert _max_diff(_peft(a1), first) < 1e-4
        assert _max_diff(load_model(resolve("tiny")).float().eval(), first) > 1e-2
        assert first.output_ids != base.output_ids  # same seed: the adapter samples other tokens

        # the same name again: replaced in place, atomically
        assert run_sync(client.update_adapter_from_path(a2), timeout_s=60, what="update") == 4
        second = run_sync(client.generate(PROMPT, PARAMS), timeout_s=60, what="generate")
        assert second.weight_versions == [4] * len(second.output_ids) and _max_diff(_peft(a2), second) < 1e-4

        # an adapter trained on another base is refused; the previous one serves on
        other = lora_adapter(tmp_path / "other", 3, model=tiny_qwen3())
        with pytest.raises(WeightUpdateError, match="refused.*does not fit this model"):
            run_sync(client.update_adapter_from_path(other), timeout_s=60, what="update")
        again = run_sync(client.generate(PROMPT, PARAMS), timeout_s=60, what="generate")
        assert client.weight_version == engine.weight_version == 4
        assert again.output_ids == second.output_ids and again.weight_versions == second.weight_versions
    finally:
        client.close()

    # a generation naming an adapter the server does not hold is refused; unload frees the name
    bad = httpx.post(f"{url}/generate", json={"input_ids": PROMPT, "lora_path": "other"}, timeout=30)
    assert bad.status_code == 400 and "names no loaded LoRA adapter" in bad.json()["error"]["message"]
    assert bad.json()["error"]["type"] == EngineRequestError.__name__
    clash = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "x", "lora_path": str(a1)}, timeout=30)
    assert (
        clash.status_code == 400
        and f"holds one LoRA adapter, {ADAPTER_NAME!r}" in clash.json()["error_message"]
    )
    out = httpx.post(f"{url}/unload_lora_adapter", json={"lora_name": ADAPTER_NAME}, timeout=30)
    assert out.status_code == 200 and out.json() == {
        "success": True,
        "error_message": "",
        "loaded_adapters": {},
    }
    loaded = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "x", "lora_path": str(a1)}, timeout=30)
    assert loaded.json()["success"] is True and engine.weight_version == 5
