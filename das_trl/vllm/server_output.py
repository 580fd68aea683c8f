"""The vLLM server's output as ``das-trl serve`` passes it through, and the line that names why the server ended.

vLLM's server can end on its own while serving: when an engine process dies (killed, out of memory, a crash in a
worker), the API server's engine monitor logs it (``"[shutdown] MPClient: engine core exited unexpectedly"``,
``vllm/v1/engine/core_client.py``; ``"Engine core process ... died unexpectedly"``, ``vllm/v1/utils.py``; vLLM 0.32
and 0.33), requests fail with ``EngineDeadError``, and the server shuts down with exit code 0. ``das-trl serve``
copies the server's stdout and stderr to its own, line by line, and keeps the lines that name an error, so that it
can end with one line that says why (:func:`ended_message`) and a non-zero exit code.
"""

from __future__ import annotations

import collections
import re
import threading
from typing import IO, BinaryIO

#: Lines that name why a server ended, strongest first: an engine process that died, a dead engine, any error.
CAUSE_PATTERNS = (
    re.compile(r"died unexpectedly|died with exit code|exited unexpectedly|out of memory|Killed", re.IGNORECASE),
    re.compile(r"EngineDeadError|EngineCore encountered an issue"),
    re.compile(r"\bERROR\b|Error\b|Exception\b"),
)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: How many error lines are kept (the last ones).
KEPT_LINES = 200
#: Longest cause shown, in characters.
MAX_CAUSE_CHARS = 300


class OutputTail:
    """Copies a process's output streams to ours and keeps the last lines that match :data:`CAUSE_PATTERNS`.

    Thread-safe: one thread per stream (:meth:`follow`) appends, :meth:`cause` reads.
    """

    def __init__(self) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def note(self, line: str) -> None:
        """Keep ``line`` (ANSI colours and surrounding space removed) if it matches a cause pattern."""
        text = _ANSI.sub("", line).strip()
        if text and any(p.search(text) for p in CAUSE_PATTERNS):
            with self._lock:
                self._lines.append(text)

    def follow(self, source: BinaryIO, sink: IO[bytes]) -> None:
        """Copy ``source`` to ``sink`` line by line in a daemon thread until ``source`` ends, noting each line."""
        def copy() -> None:
            for raw in iter(source.readline, b""):
                try:
                    sink.write(raw)
                    sink.flush()
                except (OSError, ValueError, TypeError):  # our stream closed or not binary: keep reading so the server never blocks
                    pass
                self.note(raw.decode("utf-8", errors="replace"))
            source.close()

        thread = threading.Thread(target=copy, name="das-trl-serve-output", daemon=True)
        thread.start()
        self._threads.append(thread)

    def drain(self, timeout: float = 2.0) -> None:
        """Wait up to ``timeout`` seconds for the copies to reach the end of their streams (engine processes that
        outlive the server may hold them open)."""
        for thread in self._threads:
            thread.join(timeout)

    def cause(self) -> str | None:
        """The kept line that best names why the server ended: the last line of the strongest pattern that any kept
        line matches (cut to :data:`MAX_CAUSE_CHARS`); ``None`` when no line matched."""
        with self._lock:
            lines = list(self._lines)
        for pattern in CAUSE_PATTERNS:
            for line in reversed(lines):
                if pattern.search(line):
                    return line if len(line) <= MAX_CAUSE_CHARS else line[:MAX_CAUSE_CHARS - 3] + "..."
        return None


def exit_code_words(returncode: int) -> str:
    """``"exit code 0"``, or ``"signal SIGKILL"`` for a process a signal ended (a negative ``returncode``)."""
    if returncode < 0:
        import signal

        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def ended_message(returncode: int, cause: str | None) -> str:
    """The one line ``das-trl serve`` ends with when the server stopped without being asked to."""
    why = f": {cause}" if cause else " (its output names no cause; see the lines above)"
    return (f"the vLLM server stopped while serving ({exit_code_words(returncode)}), without being asked to{why}. "
            "Clients get errors from now on. Next step: restart the server; a trainer resumes from its last "
            "checkpoint with trainer.train(resume_from_checkpoint=True)")


def ended_exit_code(returncode: int) -> int:
    """``das-trl serve``'s exit code for a server that stopped on its own: the server's when non-zero (128 + N for
    signal N, as a shell reports it), else 1 (a server that ends by itself while serving has failed)."""
    if returncode < 0:
        return 128 - returncode
    return returncode or 1
