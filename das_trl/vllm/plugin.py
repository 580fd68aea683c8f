"""vLLM general plugin (entry point group ``vllm.general_plugins``), loaded by vLLM in every process it starts."""


def register() -> None:
    """Called by vLLM's plugin loader; work is filled in by the CPU sampling fix (see cpu_sampling_fix.py)."""
