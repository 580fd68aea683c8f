"""Does GRPO have anything to learn? Sample a model on reasoning-gym tasks and measure the reward spread in groups.

GRPO learns only from groups whose completions got different rewards (TRL's ``frac_reward_zero_std`` counts the
others). Before a long run, sample ``--samples`` completions of ``--problems`` problems per task, score them with the
chosen reward functions and report, per task: mean correctness, mean reward, mean within-group reward standard
deviation, the groups with no spread, mean completion length and the share cut at ``--max-tokens``. This is how the
main job's task was chosen (on ``gsm_symbolic`` the packaged SmolLM2-135M-Instruct scored 0.01 with no spread in
any group; benchmarks/NOTES.md, "Choosing the main job's task").

Example (the main job's task and prompt; about a minute per task on 2 CPU cores)::

    python -m das_trl.bench.micro.task_spread --tasks '[["products", {"min_digits": 1, "max_digits": 1}]]' \
        --system-prompt arithmetic --rewards rg_correctness,equation

Prints one JSON object per task; ``--out FILE`` also writes every completion with its rewards (JSONL).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any, Callable

from das_trl.bench.live.config import VLLM_DTYPES, engine_seed
from das_trl.bench.options import non_negative_float, output_file, positive_int

#: The reward functions ``--rewards`` chooses from (:func:`_reward_funcs`).
REWARD_NAMES = ("rg_correctness", "format", "equation")


def group_spread(rewards: list[list[float]], correct: list[list[float]] | None = None) -> dict[str, Any]:
    """Summarise per-group rewards.

    Args:
        rewards: one list of total rewards per group (a problem's samples).
        correct: the correctness part of the same rewards (same shape), if separately known.

    Returns:
        ``{"groups", "flat_groups" (all rewards equal within 1e-9), "flat_share", "mean_reward", "mean_group_std"
        (population std per group, averaged)}`` plus ``"mean_correct"`` when ``correct`` is given.

    Raises:
        ValueError: no groups, an empty group, or ``correct`` of another shape.
    """
    if not rewards or any(not g for g in rewards):
        raise ValueError("rewards must hold at least one non-empty group")
    if correct is not None and [len(g) for g in correct] != [len(g) for g in rewards]:
        raise ValueError("correct must have the shape of rewards")
    flat = sum(1 for g in rewards if max(g) - min(g) < 1e-9)
    out = {
        "groups": len(rewards),
        "flat_groups": flat,
        "flat_share": flat / len(rewards),
        "mean_reward": statistics.fmean(r for g in rewards for r in g),
        "mean_group_std": statistics.fmean(statistics.pstdev(g) for g in rewards),
    }
    if correct is not None:
        out["mean_correct"] = statistics.fmean(c for g in correct for c in g)
    return out


def _reward_funcs(names: list[str]) -> list[tuple[str, Callable]]:
    from das_trl.defaults import rewards

    known = {"rg_correctness": rewards.correctness_reward, "format": rewards.format_reward,
             "equation": rewards.equation_reward}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown reward(s) {unknown}: use {sorted(known)}")
    return [(n, known[n]) for n in names]


def _system_prompt(name: str) -> str | None:
    from das_trl.defaults.data import ARITHMETIC_SYSTEM_PROMPT, DEFAULT_SYSTEM_PROMPT

    return {"default": DEFAULT_SYSTEM_PROMPT, "arithmetic": ARITHMETIC_SYSTEM_PROMPT, "none": None}.get(name, name)


def _tasks(text: str) -> list:
    """argparse ``type=`` of ``--tasks``: a JSON list of ``[task, task_config]`` pairs (refused before the model loads;
    text that was not JSON ended in a traceback)."""
    try:
        tasks = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"is not valid JSON ({exc}): {text!r}") from None
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, list) and len(t) == 2 for t in tasks):
        raise argparse.ArgumentTypeError(f"must be a JSON list of [task, task_config] pairs, got {text!r}")
    return tasks


def _reward_names(text: str) -> list[str]:
    """argparse ``type=`` of ``--rewards``: comma-separated names from :data:`REWARD_NAMES` (an unknown one was refused
    with a traceback)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in REWARD_NAMES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"comma-separated, from {', '.join(REWARD_NAMES)}; got {text!r}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="das_trl.bench.micro.task_spread", description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=_tasks, required=True,
                   help='JSON list of [task, task_config] pairs, e.g. \'[["chain_sum", {"max_terms": 2}]]\'')
    p.add_argument("--model", default=None, help="model path (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--problems", type=positive_int, default=16, help="problems per task (default %(default)s)")
    p.add_argument("--samples", type=positive_int, default=8,
                   help="completions per problem (the group size; default %(default)s)")
    p.add_argument("--temperature", type=non_negative_float, default=0.8, help="default %(default)s")
    p.add_argument("--max-tokens", type=positive_int, default=64, help="default %(default)s")
    p.add_argument("--system-prompt", default="default", help="'default', 'arithmetic', 'none' or the text itself")
    p.add_argument("--rewards", type=_reward_names, default="rg_correctness,equation",
                   help=f"comma-separated: {', '.join(REWARD_NAMES)} (default %(default)s)")
    p.add_argument("--seed", type=engine_seed, default=0, help="dataset and engine seed (0 to 2**32 - 1; default "
                                                                "%(default)s)")
    p.add_argument("--dtype", choices=VLLM_DTYPES, default="float32", help="vLLM's dtype (default %(default)s)")
    p.add_argument("--out", type=output_file, default=None, help="JSONL file for every completion and its rewards")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns 0."""
    args = parse_args(argv)
    tasks = args.tasks
    funcs = _reward_funcs(args.rewards)
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from das_trl.defaults.data import load_reasoning_gym_dataset

    model = args.model
    if model is None:
        from das_trl.defaults.model import prepare_default_model

        model = prepare_default_model()
    tokenizer = AutoTokenizer.from_pretrained(model)
    llm = LLM(model=model, dtype=args.dtype, enforce_eager=True, kv_cache_memory_bytes=1 << 30, max_model_len=1024,
              max_num_seqs=256, seed=args.seed)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    dump = open(args.out, "w") if args.out else None
    for task, task_config in tasks:
        data = load_reasoning_gym_dataset(task, size=args.problems, seed=args.seed, task_config=task_config or None,
                                          system_prompt=_system_prompt(args.system_prompt))
        prompts = [tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                                 return_dict=False) for row in data]
        params = SamplingParams(n=args.samples, temperature=args.temperature, max_tokens=args.max_tokens)
        outputs = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        totals, correct, lengths = [], [], []
        for row, result in zip(data, outputs):
            completions = [[{"role": "assistant", "content": o.text}] for o in result.outputs]
            n = len(completions)
            scores = {name: f(completions, entry=[row["entry"]] * n, task=[row["task"]] * n) for name, f in funcs}
            totals.append([sum(s[i] for s in scores.values()) for i in range(n)])
            correct.append(scores.get("rg_correctness", [0.0] * n))
            lengths += [len(o.token_ids) for o in result.outputs]
            if dump:
                dump.write(json.dumps({"task": task, "question": row["prompt"][-1]["content"],
                                       "texts": [o.text for o in result.outputs], "rewards": scores}) + "\n")
        summary = group_spread(totals, correct)
        summary.update(task=task, task_config=task_config, mean_length=statistics.fmean(lengths),
                       cut_share=sum(n >= args.max_tokens for n in lengths) / len(lengths))
        print(json.dumps(summary), flush=True)
    if dump:
        dump.close()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
