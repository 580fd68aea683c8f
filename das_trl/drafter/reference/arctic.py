"""The one import site of arctic-inference, an optional dependency (the ``reference`` extra).

The pure-Python reference drafter builds its suffix trees with arctic-inference's C++ ``SuffixTree``, and the replay
benchmark's ``suffix`` baseline is arctic's ``SuffixDecodingCache`` (what vLLM's ``suffix`` method runs). The default
drafter (the native core) needs neither. Both are loaded here, on first use, so a missing install gives one error
that says how to install it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only; at run time the class comes from suffix_tree()
    from arctic_inference.suffix_decoding._C import SuffixTree  # noqa: F401

INSTALL_HINT = ('install the reference extra: pip install "das-trl[reference]". arctic-inference ships only an '
                "sdist that builds against the installed torch, so install torch, cmake, ninja, grpcio-tools and "
                "nanobind==2.9.2 first and pass --no-build-isolation (pip install --no-build-isolation "
                '"das-trl[reference]"; scripts/setup_env.sh does this)')


def _missing(what: str, exc: ImportError) -> ImportError:
    return ImportError(f"{what} needs arctic-inference, which is not installed or does not load "
                       f"({type(exc).__name__}: {exc}); {INSTALL_HINT}")


def suffix_tree() -> type:
    """Return arctic-inference's C++ ``SuffixTree`` class (``SuffixTree(max_depth)``).

    Raises:
        ImportError: arctic-inference is missing or its extension does not load; the message names the extra.
    """
    try:
        from arctic_inference.suffix_decoding import _C
    except ImportError as exc:
        raise _missing("the reference drafter (backend='python')", exc) from exc
    return _C.SuffixTree


def suffix_decoding_cache() -> type:
    """Return arctic-inference's ``SuffixDecodingCache`` class (vLLM's ``suffix`` speculative method).

    Raises:
        ImportError: arctic-inference is missing or does not load; the message names the extra.
    """
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as exc:
        raise _missing("the suffix baseline (vLLM's suffix method)", exc) from exc
    return SuffixDecodingCache
