"""The one import site of the drafter's compiled core (``_das_native``, C++17 + nanobind, sources in ``src/``).

Built from source by ``scripts/build_native.sh`` (``scripts/setup_env.sh`` runs it). Everything else imports it
through :func:`load`, so a missing build gives one clear error that says how to build it.
"""

from __future__ import annotations

from types import ModuleType

_module: ModuleType | None = None
_error: str | None = None

BUILD_HINT = ("build it from source with `bash scripts/build_native.sh` (needs cmake, ninja, nanobind==2.9.2 and a "
              "C++17 compiler; scripts/setup_env.sh installs them and builds it), or set the drafter config's "
              "backend='python' to use the pure-Python reference drafter")


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
    return _module


def available() -> bool:
    """Whether the compiled core imports."""
    try:
        load()
    except ImportError:
        return False
    return True
