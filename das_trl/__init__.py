"""das-trl: Distribution-Aware Speculative decoding (DAS, arXiv 2511.13841) for GRPO rollouts in TRL.

Layers (dependencies point one way): ``das_trl.trainer`` -> ``das_trl.vllm`` -> ``das_trl.drafter``.
"""

__version__ = "0.1.0"
