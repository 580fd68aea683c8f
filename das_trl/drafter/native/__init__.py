"""The one import site of the drafter's compiled core (``_das_native``, C++17 + nanobind, sources in ``src/``).

The package build compiles it: ``pip install das-trl`` (from the sdist), ``pip install .`` and ``pip install -e .``
in a checkout, and ``python -m build`` all run the CMake project through scikit-build-core and put
``_das_native.<abi>.so`` next to this file (in an editable install, into site-packages, where scikit-build-core's
import hook maps it to this package). Everything else imports it through :func:`load`, so a missing build gives one
clear error that says how to build it; :func:`warn_if_unavailable` is the warning the trainer and ``das-trl serve``
give at start when ``backend="auto"`` would fall back to the slow pure-Python reference drafter.
"""

from __future__ import annotations

import sys
import warnings
from types import ModuleType

_module: ModuleType | None = None
_error: str | None = None

BUILD_HINT = ("reinstall das-trl so that pip builds it from source: `pip install --no-deps --force-reinstall "
              "--no-binary das-trl das-trl` (needs a C++17 compiler; cmake, ninja and nanobind are fetched as build "
              "requirements), or in a checkout `pip install -e .` (`bash scripts/build_native.sh` rebuilds it after "
              "changing the C++ sources); or set the drafter config's backend='python' to use the pure-Python "
              "reference drafter (several times more CPU per engine step; needs `pip install \"das-trl[reference]\"`)")


class NativeCoreWarning(RuntimeWarning):
    """The native drafter core did not load: the engine drafts with the pure-Python reference (same drafts, several
    times more CPU per engine step on the engine's critical path)."""


def load() -> ModuleType:
    """Return the compiled module.

    Raises:
        ImportError: the extension is not built (or was built for another Python); the message says how to build it.
    """
    global _module, _error
    if _module is None:
        try:
            from . import _das_native  # type: ignore[attr-defined]
        except ImportError as exc:
            _error = f"{type(exc).__name__}: {exc}"
            raise ImportError(f"das-trl's native drafter core is not available ({_error}); {BUILD_HINT}") from exc
        _module = _das_native
        _error = None
    return _module


def available() -> bool:
    """Whether the compiled core imports."""
    try:
        load()
    except ImportError:
        return False
    return True


def unavailable_reason() -> str | None:
    """Why the compiled core does not import (the import error, e.g. ``"ModuleNotFoundError: No module named
    'das_trl.drafter.native._das_native'"``), or ``None`` when it loads."""
    return None if available() else _error


def warn_if_unavailable(where: str, backend: str = "auto") -> bool:
    """Warn (``warnings.warn`` with :class:`NativeCoreWarning`, shown on stderr) when ``backend="auto"`` will use the
    pure-Python reference drafter because the native core does not load.

    Args:
        where: who starts the engine, for the message (e.g. ``"DASGRPOTrainer"``, ``"das-trl serve"``).
        backend: the drafter config's backend; only ``"auto"`` falls back silently (``"native"`` raises at drafter
            creation, ``"python"`` is an explicit choice).

    Returns:
        True if the native core loads (nothing is said).
    """
    if available():
        return True
    if backend == "auto":
        warnings.warn(
            f"{where}: das-trl's native drafter core is not available ({_error}), so the engine drafts with the "
            f"pure-Python reference drafter (the same drafts, several times more CPU per engine step on the "
            f"engine's critical path). To fix: {BUILD_HINT}. `das-trl doctor` checks this.",
            NativeCoreWarning, stacklevel=3)
        sys.stderr.flush()
    return False
