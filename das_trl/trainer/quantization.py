"""Which quantization the colocated vLLM engine must load the model with, as TRL decides it.

TRL 1.16 (``trl/generation/vllm_generation.py``, ``VLLMGeneration._init_vllm``, colocate branch) scans the policy for
bitsandbytes layers: a 4-bit layer (QLoRA) makes it build the engine with ``quantization="bitsandbytes"``, so the
engine holds the same packed 4-bit weights that TRL's in-place weight push later sends; an 8-bit layer is refused
("vLLM does not support in-flight 8-bit quantization"). :func:`engine_quantization` does the same, so
``DASVLLMGeneration``'s colocated engine matches TRL's.
"""

from __future__ import annotations

from typing import Any

#: TRL's words for the 8-bit refusal, with das-trl's next step added.
EIGHT_BIT_MESSAGE = (
    "the policy has a bitsandbytes 8-bit layer ({name}: {cls}), and vLLM does not support in-flight 8-bit "
    "quantization (TRL refuses it too). Allowed: full precision, or 4-bit bitsandbytes (QLoRA: "
    "BitsAndBytesConfig(load_in_4bit=True)), which the colocated engine then loads with "
    "quantization='bitsandbytes'. Next step: load the model in 4-bit or without quantization."
)


def _bnb_linear_classes() -> tuple[type, type] | None:
    """bitsandbytes' ``(Linear4bit, Linear8bitLt)`` when transformers says bitsandbytes is usable, else ``None``
    (the check TRL makes, ``transformers.is_bitsandbytes_available``)."""
    from transformers import is_bitsandbytes_available

    if not is_bitsandbytes_available():
        return None
    import bitsandbytes as bnb

    return bnb.nn.Linear4bit, bnb.nn.Linear8bitLt


def engine_quantization(model: Any) -> str | None:
    """The ``quantization`` argument for a colocated ``vllm.LLM`` serving ``model``.

    Args:
        model: the policy (``PreTrainedModel`` or ``PeftModel``); its ``named_modules()`` are scanned in order, as TRL
            does, and the first bitsandbytes layer decides.

    Returns:
        ``"bitsandbytes"`` for a 4-bit bitsandbytes model (QLoRA), ``None`` otherwise (also when bitsandbytes is not
        installed or not usable here).

    Raises:
        ValueError: the first bitsandbytes layer found is 8-bit (``Linear8bitLt``).
    """
    classes = _bnb_linear_classes()
    if classes is None:
        return None
    linear_4bit, linear_8bit = classes
    for name, module in model.named_modules():
        if isinstance(module, linear_4bit):
            return "bitsandbytes"
        if isinstance(module, linear_8bit):
            raise ValueError(EIGHT_BIT_MESSAGE.format(name=name, cls=type(module).__name__))
    return None
