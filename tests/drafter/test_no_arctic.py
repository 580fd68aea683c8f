"""The default path stands without arctic-inference (an optional dependency, the ``reference`` extra): with its import
blocked, the trainer and the vLLM proposer import, the native drafter drafts and a native replay runs, and whatever
does need arctic (the reference drafter, the replay's ``suffix`` baseline) raises an ImportError that names the
extra."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import io, json, sys
from contextlib import redirect_stdout


class BlockArctic:
    """An import hook that makes arctic-inference look uninstalled."""

    def find_spec(self, name, path=None, target=None):
        if name == "arctic_inference" or name.startswith("arctic_inference."):
            raise ImportError(f"No module named {name!r} (blocked by test_no_arctic)")
        return None


sys.meta_path.insert(0, BlockArctic())
out = {}

import das_trl.trainer  # noqa: E402,F401
import das_trl.vllm.proposer  # noqa: E402,F401
from das_trl.drafter import DrafterConfig, create_drafter  # noqa: E402

drafter = create_drafter(DrafterConfig(backend="native", draft_threads=1, builder_threads=1))
out["native"] = type(drafter).__name__
prompt, completion = [1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11, 12]
drafter.add_rollouts([prompt] * 4, [completion] * 4)
drafter.wait_for_updates(30)
drafter.start_request("r", prompt)
drafter.extend_request("r", completion[:3])
out["draft"] = drafter.propose("r", None, 4)
out["reference_loaded"] = sorted(m for m in sys.modules if m.startswith("das_trl.drafter.reference"))

from das_trl.bench import replay  # noqa: E402
from das_trl.bench.drafters import make_drafter  # noqa: E402

with redirect_stdout(io.StringIO()) as table:
    out["replay_rc"] = replay.main(["--rollouts", "benchmarks/sets/grpo_smollm2_products.jsonl.gz",
                                    "--drafters", "none,das+controller"])
out["replay_table"] = table.getvalue()


def error_of(make):
    try:
        make()
    except ImportError as exc:
        return str(exc)
    return None


out["python_backend"] = error_of(lambda: create_drafter(DrafterConfig(backend="python")))
out["suffix_baseline"] = error_of(lambda: make_drafter("suffix"))
from das_trl.drafter import native  # noqa: E402

native.available = lambda: False  # "auto" on a machine without the core: it falls back to the reference
out["auto_without_core"] = error_of(lambda: create_drafter(DrafterConfig(backend="auto")))
out["arctic_loaded"] = sorted(m for m in sys.modules if m.startswith("arctic_inference"))
print(json.dumps(out))
'''


def test_default_path_runs_without_arctic():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["native"] == "NativeDASDrafter"
    assert out["draft"] == [8, 9, 10, 11]
    assert out["reference_loaded"] == []  # the trainer, the proposer and the native drafter never import it
    assert out["replay_rc"] == 0
    assert "das+controller" in out["replay_table"]
    assert out["arctic_loaded"] == []
    assert "the native core is not built" in (out["auto_without_core"] or ""), out["auto_without_core"]
    for what in ("python_backend", "suffix_baseline", "auto_without_core"):
        message = out[what]
        assert message is not None, f"{what}: no ImportError without arctic-inference"
        assert 'pip install "das-trl[reference]"' in message, message
        assert "--no-build-isolation" in message and "nanobind==2.9.2" in message, message
