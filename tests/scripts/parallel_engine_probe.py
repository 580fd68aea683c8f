"""A real vLLM engine with the DAS drafter and tensor or pipeline parallelism, on the CPU build (not a CI test: three
engine processes on a 2-core machine take about 2 minutes; docs/gpu.md quotes its output).

    VLLM_CPU_OMP_THREADS_BIND="0|1|1" python tests/scripts/parallel_engine_probe.py tp   # TP = 3
    VLLM_CPU_OMP_THREADS_BIND="0|1" python tests/scripts/parallel_engine_probe.py pp     # PP = 2

The packaged SmolLM2-135M has 9 attention heads, so TP = 3 (TP = 2 is rejected by vLLM). It prints each worker's
``das_stats`` reply before and after ``attach`` (rank 0 drafts; the other ranks answer "no drafter on this rank"),
then generates greedily, pushes the output as history, generates again and prints the history digests (one per
drafting worker), the draft / accepted counts and whether the two greedy outputs are identical. With ``pp`` on vLLM
0.32 the engine fails at start (vLLM issue #30436), which is why ``das-trl serve`` refuses PP > 1 there.
"""

from __future__ import annotations

import json
import sys
import time


def main(kind: str) -> None:
    from vllm import LLM, SamplingParams

    from das_trl.defaults.model import prepare_default_model
    from das_trl.vllm.client import LocalDASEngine
    from das_trl.vllm.engine import das_engine_kwargs

    size = {"pp": {"pipeline_parallel_size": 2}, "tp": {"tensor_parallel_size": 3}}[kind]
    started = time.time()
    llm = LLM(model=prepare_default_model(), dtype="float32", enforce_eager=True, max_model_len=512,
              kv_cache_memory_bytes=256 * 1024**2, distributed_executor_backend="mp", seed=0,
              **size, **das_engine_kwargs(4))
    print(f"PROBE built in {time.time() - started:.0f} s", flush=True)
    raw = llm.collective_rpc("das_stats")
    print("PROBE das_stats per worker:", json.dumps([{k: r.get(k) for k in ("ok", "no_drafter", "error")}
                                                      for r in raw]))
    engine = LocalDASEngine(llm)
    print("PROBE attach:", engine.attach()["attached"])
    raw = llm.collective_rpc("das_stats")
    print("PROBE attached per worker:", json.dumps([(r.get("stats") or {}).get("attached") for r in raw]))
    tokenizer = llm.get_tokenizer()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Count from 1 to 20."}],
                                           add_generation_prompt=True, tokenize=True, return_dict=False)
    params = SamplingParams(temperature=0.0, max_tokens=24)
    first = list(llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0].token_ids)
    engine.add_history([prompt], [first])
    second = list(llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0].token_ids)
    stats = engine.stats()
    print("PROBE digests:", engine.history_digests(), "history_sequences", stats["history_sequences"],
          "draft_tokens", stats.get("draft_tokens"), "accepted_tokens", stats.get("accepted_tokens"),
          "greedy identical", first == second, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
