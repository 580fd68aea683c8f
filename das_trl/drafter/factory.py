"""Pick the drafter implementation a config asks for (``DrafterConfig.backend``)."""

from __future__ import annotations

import logging

from . import native
from .config import DrafterConfig
from .drafter import DASDrafter

logger = logging.getLogger(__name__)
_warned = False


def create_drafter(config: DrafterConfig | None = None):
    """Return a :class:`~das_trl.drafter.native_drafter.NativeDASDrafter` or a
    :class:`~das_trl.drafter.drafter.DASDrafter` for ``config.backend``.

    ``"auto"`` takes the native core when it is built and otherwise logs one warning and uses the Python reference
    (same drafts up to ties, several times more CPU per round on the engine's critical path).

    Raises:
        ImportError: ``backend="native"`` and the core is not built; the message says how to build it.
    """
    global _warned
    config = config if config is not None else DrafterConfig()
    if config.backend == "python":
        return DASDrafter(config)
    if config.backend == "native" or native.available():
        from .native_drafter import NativeDASDrafter

        return NativeDASDrafter(config)
    if not _warned:
        _warned = True
        logger.warning("das-trl: native drafter core not built, using the Python reference drafter; %s",
                       native.BUILD_HINT)
    return DASDrafter(config)
