"""Pick the drafter implementation a config asks for (``DrafterConfig.backend``)."""

from __future__ import annotations

import logging

from . import native
from .config import DrafterConfig

logger = logging.getLogger(__name__)
_warned = False


def create_drafter(config: DrafterConfig | None = None):
    """Return a :class:`~das_trl.drafter.drafter.NativeDASDrafter` or a
    :class:`~das_trl.drafter.reference.DASDrafter` for ``config.backend``.

    ``"auto"`` takes the native core when it is built and otherwise logs one warning and uses the Python reference
    (same drafts up to ties, several times more CPU per round on the engine's critical path). Only the reference
    imports ``das_trl.drafter.reference`` (and arctic-inference).

    Raises:
        TypeError: ``config`` is not a :class:`DrafterConfig` (build one: ``DrafterConfig(**fields)``).
        ValueError: a field set after construction is invalid (the config is checked again).
        ImportError: ``backend="native"`` and the core is not built (the message says how to build it);
            ``backend="python"`` (or ``"auto"`` without the core) and arctic-inference is missing (the message names
            the ``reference`` extra).
    """
    global _warned
    config = config if config is not None else DrafterConfig()
    if not isinstance(config, DrafterConfig):
        raise TypeError(f"create_drafter takes a DrafterConfig (or None), got {type(config).__name__}; "
                        "build one with DrafterConfig(**fields)")
    config.__post_init__()  # again: a field set after construction was never checked
    if config.backend == "native" or (config.backend == "auto" and native.available()):
        from .drafter import NativeDASDrafter

        return NativeDASDrafter(config)
    if config.backend == "auto" and not _warned:
        _warned = True
        logger.warning("das-trl: native drafter core not built, using the Python reference drafter; %s",
                       native.BUILD_HINT)
    from .reference import DASDrafter

    try:
        return DASDrafter(config)
    except ImportError as exc:
        if config.backend == "python":
            raise
        raise ImportError(f"no drafter available: the native core is not built ({native.BUILD_HINT}), and {exc}") \
            from exc
