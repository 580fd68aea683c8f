"""Drop-in proof: a GRPO script written for stock TRL runs with das-trl after changing only the import and the class
names, on the embedded model and data, in colocate and in server mode, and its rollouts go through the DAS engine.

The stock script is ``tests/scripts/stock_trl_grpo.py`` (nothing from das-trl in it); :func:`das_variant` produces the
das-trl version by text replacement and checks that the diff is exactly the import line and the two constructor
calls. The variant runs in this process (one GRPO step) with the model path, data directory and vLLM mode passed
through environment variables the stock script reads.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path

import pytest
from server_utils import start_das_server, stop

pytestmark = [pytest.mark.engine, pytest.mark.trainer]

STOCK_SCRIPT = Path(__file__).parent / "scripts" / "stock_trl_grpo.py"
#: torch.distributed launch variables a subprocess must not inherit from in-process trainer tests.
DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
STOCK_IMPORT = "from trl import GRPOConfig, GRPOTrainer"
DAS_IMPORT = "from das_trl.trainer import DASGRPOConfig, DASGRPOTrainer"


def das_variant(source: str) -> str:
    """The das-trl version of a stock TRL GRPO script: the import line and the class names replaced, nothing else.

    Raises:
        AssertionError: the script does not have exactly one stock import line, or the diff touches other lines.
    """
    assert source.count(STOCK_IMPORT) == 1, "the stock script must import GRPOConfig, GRPOTrainer from trl once"
    out = source.replace(STOCK_IMPORT, DAS_IMPORT)
    out = re.sub(r"\bGRPOConfig\(", "DASGRPOConfig(", out)
    out = re.sub(r"\bGRPOTrainer\(", "DASGRPOTrainer(", out)
    changed = [line for line in difflib.unified_diff(source.splitlines(), out.splitlines(), lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert sorted(changed) == sorted([
        f"-{STOCK_IMPORT}", f"+{DAS_IMPORT}",
        "-training_args = GRPOConfig(", "+training_args = DASGRPOConfig(",
        "-trainer = GRPOTrainer(", "+trainer = DASGRPOTrainer(",
    ]), changed
    return out


def test_das_variant_changes_only_import_and_class_names():
    source = STOCK_SCRIPT.read_text()
    code = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert code and not any("das_trl" in line for line in code), code  # the stock script imports plain TRL only
    variant = das_variant(source)
    assert DAS_IMPORT in variant and "trl import GRPOConfig" not in variant
    with pytest.raises(AssertionError):
        das_variant(source.replace(STOCK_IMPORT, "from trl import GRPOTrainer, GRPOConfig"))


@pytest.fixture(scope="module")
def stock_data_dir(tmp_path_factory) -> str:
    """A local dataset directory (one JSON-lines file; columns ``prompt``, ``answer``) from the embedded data."""
    from das_trl.defaults.data import load_reasoning_gym_dataset

    directory = tmp_path_factory.mktemp("stock-data")
    load_reasoning_gym_dataset("gsm_symbolic", size=2, seed=0).select_columns(["prompt", "answer"]).to_json(
        str(directory / "train.jsonl"))
    return str(directory)


def _run_variant(monkeypatch, tmp_path, model_path: str, data_dir: str, mode: str, base_url: str | None = None):
    """Execute the das-trl variant of the stock script in this process; returns the script's ``trainer``."""
    monkeypatch.setenv("MODEL_NAME", model_path)
    monkeypatch.setenv("DATASET", data_dir)
    monkeypatch.setenv("VLLM_MODE", mode)
    monkeypatch.setenv("OUTPUT_DIR", str(tmp_path / "out"))
    # CPU engine settings through the environment, so the script itself stays stock: an explicit KV cache size (a
    # memory fraction counts the trainer's own RAM on CPU builds), eager mode (no torch.compile wait), float32.
    monkeypatch.setenv("DAS_TRL_VLLM_KWARGS", json.dumps(
        {"kv_cache_memory_bytes": 512 * 1024**2, "enforce_eager": True, "dtype": "float32"}))
    if base_url is not None:
        monkeypatch.setenv("VLLM_SERVER_BASE_URL", base_url)
    namespace = {"__name__": "__main__", "__file__": str(STOCK_SCRIPT)}
    exec(compile(das_variant(STOCK_SCRIPT.read_text()), str(STOCK_SCRIPT), "exec"), namespace)  # noqa: S102
    return namespace["trainer"]


def _das_logs(trainer) -> list[dict]:
    return [h for h in trainer.state.log_history if "das/rollout_seconds" in h]


def test_stock_script_colocate_mode(monkeypatch, tmp_path, model_path, stock_data_dir):
    from das_trl.trainer import DASGRPOTrainer

    trainer = _run_variant(monkeypatch, tmp_path, model_path, stock_data_dir, "colocate")
    assert isinstance(trainer, DASGRPOTrainer)
    logs = _das_logs(trainer)
    assert len(logs) == 1, trainer.state.log_history
    assert logs[0]["das/history_problems"] == 1  # the step's rollouts reached the drafter history
    stats = trainer.vllm_generation.das_stats()
    assert stats["attached"] and stats["request_rounds"] > 0, stats  # the DAS proposer ran every round
    assert stats["draft_tokens"] > 0, stats  # and drafted (prompt/local and sibling trees: no history at step 1)
    assert logs[0]["das/draft_tokens"] == stats["draft_tokens"]


def test_stock_script_server_mode(monkeypatch, tmp_path, model_path, stock_data_dir):
    from das_trl.trainer import DASGRPOTrainer
    from das_trl.vllm.client import HTTPDASEngine

    # `das-trl serve`'s default K is also the config's default das_num_speculative_tokens.
    from das_trl.vllm.engine import DEFAULT_NUM_SPECULATIVE_TOKENS

    base_url, process = start_das_server(model_path, num_speculative_tokens=DEFAULT_NUM_SPECULATIVE_TOKENS)
    try:
        trainer = _run_variant(monkeypatch, tmp_path, model_path, stock_data_dir, "server", base_url)
        assert isinstance(trainer, DASGRPOTrainer)
        assert trainer.vllm_generation.engine is not None
        logs = _das_logs(trainer)
        assert len(logs) == 1, trainer.state.log_history
        stats = HTTPDASEngine(base_url).stats()
        assert stats["history_sequences"] == 4 and stats["request_rounds"] > 0, stats
        assert logs[0]["das/draft_tokens"] == stats["draft_tokens"]
    finally:
        stop(process)


# ------------------------------------------------------------------------------------------ TRL's own GRPO script
TRL_CLASS_SWAP = {"GRPOTrainer": "DASGRPOTrainer", "GRPOConfig": "DASGRPOConfig"}


def trl_script_das_variant(source: str) -> str:
    """TRL's ``trl/scripts/grpo.py`` with only ``GRPOTrainer`` / ``GRPOConfig`` swapped for das-trl's classes: the two
    names leave their ``from trl import ...`` lines, a ``from das_trl.trainer import ...`` line (same indentation)
    follows each, and their uses are renamed.

    Raises:
        AssertionError: a class is not imported from trl, or the diff touches anything else.
    """
    out: list[str] = []
    for line in source.splitlines():
        match = re.match(r"^(\s*)from trl import (.+)$", line)
        names = [n.strip() for n in match.group(2).split(",")] if match else []
        swapped = [n for n in names if n in TRL_CLASS_SWAP]
        if swapped:
            rest = [n for n in names if n not in TRL_CLASS_SWAP]
            if rest:
                out.append(f"{match.group(1)}from trl import {', '.join(rest)}")
            out.append(f"{match.group(1)}from das_trl.trainer import {', '.join(TRL_CLASS_SWAP[n] for n in swapped)}")
            continue
        for old, new in TRL_CLASS_SWAP.items():
            line = re.sub(rf"\b{old}\b", new, line)
        out.append(line)
    variant = "\n".join(out) + "\n"
    for old, new in TRL_CLASS_SWAP.items():
        assert re.search(rf"^\s*from das_trl.trainer import .*\b{new}\b", variant, re.M), f"{old} not imported"
        assert not re.search(rf"\b{old}\b", variant.replace(new, "")), f"{old} left in the script"
    for line in difflib.unified_diff(source.splitlines(), out, lineterm="", n=0):
        if line.startswith(("+++", "---", "@@")):
            continue
        body = line[1:]
        # Every changed line is one of the trl import lines, or a use of a class with only its name changed.
        assert (re.match(r"\s*from (trl|das_trl\.trainer) import ", body)
                or any(new in body for new in TRL_CLASS_SWAP.values())
                or any(re.search(rf"\b{old}\b", body) for old in TRL_CLASS_SWAP)), line
    return variant


def test_trl_script_variant_swaps_only_the_two_classes():
    import trl.scripts.grpo as trl_grpo

    source = Path(trl_grpo.__file__).read_text()
    variant = trl_script_das_variant(source)
    assert "trainer = DASGRPOTrainer(" in variant and "(GRPOScriptArguments, DASGRPOConfig, ModelConfig" in variant
    assert "from trl import DASGRPO" not in variant
    assert variant.count("\n") - source.count("\n") == 2  # one import line more per swapped class
    with pytest.raises(AssertionError):
        trl_script_das_variant(source.replace("GRPOTrainer", "RLTrainer"))


def test_trl_grpo_script_trains_through_das_and_exits_cleanly(tmp_path, model_path):
    """TRL's own GRPO script (read from the installed trl, classes swapped on the fly) trains 3 steps through the
    colocated DAS engine, drafts are accepted, and the process exits 0 without a traceback: the engine is shut down
    before the script's ``trainer.end()`` destroys the process group (transformers >= 5.18)."""
    import subprocess
    import sys

    import trl.scripts.grpo as trl_grpo
    from das_trl.defaults.data import load_reasoning_gym_dataset

    data = tmp_path / "data"
    data.mkdir()
    # Two 1-digit products, so steps 2-3 revisit a problem and draft from its history too.
    load_reasoning_gym_dataset("products", size=2, seed=0, task_config={"min_digits": 1, "max_digits": 1}) \
        .select_columns(["prompt", "entry", "task"]).to_json(str(data / "train.jsonl"))
    script = tmp_path / "trl_grpo_das.py"
    script.write_text(trl_script_das_variant(Path(trl_grpo.__file__).read_text()))
    # A clean launch: earlier in-process trainer tests leave RANK / LOCAL_RANK / WORLD_SIZE / MASTER_* in os.environ
    # (the colocated engine's process group, still bound); inherited, they made accelerate start a process group on
    # that port (EADDRINUSE in a full run).
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    env.update(DAS_TRL_VLLM_KWARGS=json.dumps(
        {"kv_cache_memory_bytes": 512 * 1024**2, "enforce_eager": True, "dtype": "float32"}),
        OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    out = tmp_path / "out"
    command = [sys.executable, str(script), "--model_name_or_path", model_path, "--dataset_name", str(data),
               "--reward_funcs", "das_trl.defaults.rewards.correctness_reward", "das_trl.defaults.rewards.format_reward",
               "--output_dir", str(out), "--use_vllm", "--vllm_mode", "colocate", "--vllm_max_model_length", "768",
               "--max_steps", "3", "--per_device_train_batch_size", "4", "--num_generations", "4",
               "--max_completion_length", "32", "--logging_steps", "1", "--save_strategy", "no",
               "--report_to", "none", "--bf16", "false", "--das_record_rollouts", str(tmp_path / "rollouts.jsonl")]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    logs = result.stdout + result.stderr
    assert result.returncode == 0, logs[-6000:]
    assert "Traceback" not in result.stderr, result.stderr[-6000:]
    assert "Training completed." in result.stdout, logs[-3000:]
    accepted = [float(v) for v in re.findall(r"'das/accepted_tokens': '?([0-9.]+)", logs)]
    assert len(accepted) == 3 and sum(accepted) > 0, logs[-6000:]  # 3 logged steps, drafts accepted
    assert re.findall(r"'das/native_core': '?1", logs), logs[-3000:]  # drafted by the native core
    assert (out / "model.safetensors").exists()
