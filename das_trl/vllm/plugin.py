"""vLLM general plugin (entry point group ``vllm.general_plugins``), loaded by vLLM in every process it starts."""

import logging

logger = logging.getLogger("vllm.das_trl.plugin")


def register() -> None:
    """Called by vLLM's plugin loader in every vLLM process (front end, engine core, workers).

    Installs the CPU rejection-sampler fix (:mod:`das_trl.vllm.cpu_sampling_fix`) and the verification-logprobs patch
    (:mod:`das_trl.vllm.verification_logprobs`: logprobs at the verified positions only); never raises, so a problem
    with either cannot stop vLLM from starting (it logs a warning instead).
    """
    try:
        from das_trl.vllm.cpu_sampling_fix import install_fix

        install_fix()
    except Exception:  # noqa: BLE001 - a plugin must not break vLLM start-up
        logger.warning("das_trl: could not install the CPU sampling fix", exc_info=True)
    try:
        from das_trl.vllm.verification_logprobs import install_patch

        install_patch()
    except Exception:  # noqa: BLE001 - a plugin must not break vLLM start-up
        logger.warning("das_trl: could not install the verification-logprobs patch", exc_info=True)
