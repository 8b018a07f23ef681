"""agentrl's vLLM worker extension: methods ``/collective_rpc`` can call inside vLLM's worker processes.

This file runs in vLLM's environment, not agentrl's: it imports only the standard library,
torch and vLLM. :func:`agentrl.engines.launcher.vllm_command` puts its directory on the
server's ``PYTHONPATH`` and passes ``--worker-extension-cls agentrl_vllm_worker.WorkerExtension``.

Why it exists: vLLM's in-place ``reload_weights`` re-processes only the layers whose tensors
the checkpoint names. A tied output head (``tie_word_embeddings``, as every agentrl catalogue
model and small Qwen models have) is never named, so on the CPU backend its prepacked GEMM
weight kept the *old* embedding: after an update, tokens were sampled from new hidden states
through the old head (measured: |Δlogp| up to 2.4 against the new weights, 1e-6 for every
other layer). :meth:`WorkerExtension.agentrl_reload` reloads, then re-processes the head.
"""

from __future__ import annotations

from typing import Any


class WorkerExtension:
    """Mixed into vLLM's worker class (``self`` is the worker: ``model_runner``, ``reload_weights``)."""

    def agentrl_reload(self, weights_path: str) -> dict[str, Any]:
        """Reload every weight from ``weights_path`` in place, then refresh what derives from tied tensors."""
        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        refreshed = []
        head = getattr(model, "lm_head", None)
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)
            refreshed.append("lm_head")
        return {"path": weights_path, "refreshed": refreshed}
