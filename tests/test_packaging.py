"""Installed the way users install: the sdist and the platform wheel built from this checkout by the standard build
frontend (``python -m build``: scikit-build-core runs the CMake project) contain the native drafter core, and the wheel,
installed into a fresh virtual environment outside the source tree with numpy as its only other package (no torch,
no vLLM, no arctic-inference), loads the core and replays a recorded GRPO set with it. A second check shows that the
proposer the engine runs needs no arctic-inference (the optional ``[reference]`` extra), while the pure-Python
reference drafter names that extra when it is missing.

Cost on 2 CPU cores: about 2-3 minutes for the build (one C++ compile, from the sdist) and the fresh environment;
the rest takes seconds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

import das_trl

ROOT = Path(__file__).resolve().parents[1]
REPLAY_SET = ROOT / "benchmarks" / "sets" / "grpo_smollm2_products.jsonl.gz"
NATIVE_SO = re.compile(r"^das_trl/drafter/native/_das_native\.[^/]+\.so$")


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, command))} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """``python -m build`` of this checkout: the sdist, then the wheel built from that sdist (as pip would)."""
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], env=env, timeout=1200)
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


def test_wheel_and_sdist_contents(dist):
    wheel = dist["wheel"]
    # A platform wheel for this interpreter, not a pure-Python one.
    assert f"das_trl-{das_trl.__version__}-cp{sys.version_info[0]}{sys.version_info[1]}-" in wheel.name, wheel.name
    assert "-none-any" not in wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(f"das_trl-{das_trl.__version__}.dist-info/METADATA").decode()
    assert [n for n in names if NATIVE_SO.match(n)], names  # the compiled core
    for required in ("das_trl/py.typed", "das_trl/drafter/native/_das_native.pyi",
                     f"das_trl-{das_trl.__version__}.dist-info/licenses/LICENSE"):
        assert required in names, required
    assert not [n for n in names if n.endswith((".cc", ".h")) or "__pycache__" in n]  # sources stay in the sdist
    assert f"Version: {das_trl.__version__}" in metadata
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
    assert "Typing :: Typed" in metadata
    arctic = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: arctic-inference")]
    assert arctic and all('extra == "reference"' in line for line in arctic), arctic  # optional only
    with tarfile.open(dist["sdist"]) as t:
        members = {m.split("/", 1)[1] for m in t.getnames() if "/" in m}
    for required in ("pyproject.toml", "CMakeLists.txt", "LICENSE", "das_trl/drafter/native/CMakeLists.txt",
                     "das_trl/drafter/native/src/bindings.cc", "das_trl/drafter/native/_das_native.pyi"):
        assert required in members, required
    assert not [m for m in members if m.endswith(".so")]  # no prebuilt binary in the sdist


# What runs inside the fresh environment: the installed package (not this checkout) loads its native core, the
# default drafter is the native one, arctic-inference is absent and the reference backend says which extra to install.
_FRESH_CHECK = textwrap.dedent("""
    import json, sys
    import das_trl
    from das_trl.drafter import DrafterConfig, create_drafter, native
    core = native.load()
    drafter = create_drafter(DrafterConfig())
    try:
        import arctic_inference  # noqa: F401
        arctic = "installed"
    except ImportError:
        arctic = "absent"
    try:
        create_drafter(DrafterConfig(backend="python"))
        reference = "built"
    except ImportError as exc:
        reference = str(exc)
    print(json.dumps({"package": das_trl.__file__, "core": core.__file__, "drafter": type(drafter).__name__,
                      "arctic": arctic, "reference": reference}))
""")


def test_wheel_in_fresh_venv_loads_the_core_and_replays_natively(dist, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], timeout=300)
    python = str(venv / "bin" / "python")
    # The wheel alone, plus numpy for the replay: no torch, vLLM, TRL or arctic-inference.
    _run([python, "-m", "pip", "install", "--quiet", "--no-deps", str(dist["wheel"])], timeout=600)
    _run([python, "-m", "pip", "install", "--quiet", "numpy>=1.26"], timeout=600)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    found = json.loads(_run([python, "-c", _FRESH_CHECK], cwd=tmp_path, env=env, timeout=300).stdout.splitlines()[-1])
    site = str(venv)
    assert found["package"].startswith(site) and found["core"].startswith(site), found  # not the checkout
    assert found["drafter"] == "NativeDASDrafter" and found["arctic"] == "absent", found
    assert "das-trl[reference]" in found["reference"], found  # the reference backend names its extra
    # A short replay of a recorded GRPO set, drafting with the native core (backend "native": no fallback).
    replay = _run([python, "-m", "das_trl.bench.replay", "--rollouts", str(REPLAY_SET),
                   "--drafters", "none,das+siblings", "--das-config", json.dumps({"backend": "native"}),
                   "--json", str(tmp_path / "replay.json")], cwd=tmp_path, env=env, timeout=600)
    rows = {line.split()[0]: line.split() for line in replay.stdout.splitlines() if line[:1].isalpha()}
    assert float(rows["none"][1]) == 1.0, replay.stdout
    assert float(rows["das+siblings"][1]) > 1.5, replay.stdout  # tokens per round: drafts were accepted


_NO_ARCTIC_PROPOSER = textwrap.dedent("""
    import importlib.abc, json, sys

    class NoArctic(importlib.abc.MetaPathFinder):  # as if the [reference] extra were not installed
        def find_spec(self, name, path=None, target=None):
            if name == "arctic_inference" or name.startswith("arctic_inference."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoArctic())
    import numpy as np
    from reliability_fakes import push_long_and_short_history, run_round, FakeWorker

    worker = FakeWorker()
    assert worker.das_attach(json.dumps({}))["ok"]
    prompts, texts = push_long_and_short_history(worker, np.random.default_rng(0))
    run_round(worker, prompts, texts, [("a", 0, 5), ("b", 3, 5)])
    drafts = run_round(worker, prompts, texts, [("a", 0, 6), ("b", 3, 6)])
    from das_trl.drafter import DrafterConfig, create_drafter
    try:
        create_drafter(DrafterConfig(backend="python"))
        reference = "built"
    except ImportError as exc:
        reference = str(exc)
    print(json.dumps({"drafts": drafts, "drafter": type(worker.proposer.drafter).__name__,
                      "arctic_loaded": any(m.startswith("arctic_inference") for m in sys.modules),
                      "reference": reference}))
""")


def test_proposer_runs_without_arctic_inference():
    """The engine's proposer (real DASWorkerExtension + DASProposer behind a fake model runner) drafts with the
    native core while arctic-inference cannot be imported; the reference backend's ImportError names the extra."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    found = json.loads(_run([sys.executable, "-c", _NO_ARCTIC_PROPOSER], cwd=ROOT, env=env, timeout=300)
                       .stdout.strip().splitlines()[-1])
    assert found["drafter"] == "NativeDASDrafter" and not found["arctic_loaded"], found
    assert any(found["drafts"]), found  # history drafts came back
    assert "das-trl[reference]" in found["reference"], found


def test_native_core_warning_when_it_cannot_load(monkeypatch):
    """backend='auto' without the core: a real warning (NativeCoreWarning, shown on stderr) that says how to fix it;
    nothing is said when the core loads or when the Python backend was chosen."""
    from das_trl.drafter import native

    assert native.warn_if_unavailable("test") is True  # the core loads here: silent
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.delattr(native, "_das_native", raising=False)
    monkeypatch.setitem(sys.modules, "das_trl.drafter.native._das_native", None)
    with pytest.warns(native.NativeCoreWarning, match=r"DASGRPOTrainer: .*pure-Python reference.*pip install"):
        assert native.warn_if_unavailable("DASGRPOTrainer") is False
    assert native.unavailable_reason() and "_das_native" in native.unavailable_reason()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.warn_if_unavailable("DASGRPOTrainer", backend="python") is False  # explicit choice: silent


def _nb_parameters(function) -> list[str]:
    """Parameter names of a nanobind function, from its ``__nb_signature__`` (``"def f(a: T[x, y], b: U = \\0)"``)."""
    signature = function.__nb_signature__[0][0]
    inner = signature[signature.index("(") + 1: signature.rindex(") ->")]
    names, depth, current = [], 0, ""
    for char in inner + ",":
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        if char == "," and depth == 0:
            if current.strip():
                names.append(current.split(":")[0].split("=")[0].strip())
            current = ""
        else:
            current += char
    return names


def test_native_stub_matches_the_compiled_module():
    """``_das_native.pyi`` declares exactly what the compiled module exports, with the same parameter names, and
    documents every function (the stub is what type checkers and IDEs read)."""
    import ast

    from das_trl.drafter import native

    module = native.load()
    tree = ast.parse((ROOT / "das_trl" / "drafter" / "native" / "_das_native.pyi").read_text())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    fix = "update das_trl/drafter/native/_das_native.pyi to the bindings in src/bindings.cc"
    exported_classes = {n for n in dir(module) if isinstance(getattr(module, n), type) and not n.startswith("_")}
    assert set(classes) == exported_classes == {"Drafter", "RequestBook", "StepOutputs"}, (fix, sorted(classes),
                                                                                          exported_classes)
    exported = {n for n in dir(module) if callable(getattr(module, n)) and not n.startswith("_")} - exported_classes
    assert set(functions) == exported, (fix, sorted(set(functions) ^ exported))
    declared_all = [*functions.items()]
    for cname, cnode in classes.items():
        assert ast.get_docstring(cnode), f"{cname} has no docstring in the stub"
        methods = {node.name: node for node in cnode.body if isinstance(node, ast.FunctionDef)}
        cls = getattr(module, cname)
        bound = {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}
        assert set(methods) - {"__init__"} == bound, (fix, cname, sorted((set(methods) - {"__init__"}) ^ bound))
        declared_all += [(f"{cname}.{k}", v) for k, v in methods.items()]
    assert hasattr(module, "MAX_SPEC_TOKENS") and "MAX_SPEC_TOKENS" in ast.unparse(tree)
    for name, node in declared_all:
        assert ast.get_docstring(node), f"{name} has no docstring in the stub"
        compiled = getattr(module, name) if "." not in name else getattr(getattr(module, name.split(".")[0]),
                                                                          name.split(".")[1])
        declared = [a.arg for a in node.args.args]
        assert declared == _nb_parameters(compiled), (fix, name, declared, _nb_parameters(compiled))
