"""Stand-alone benchmarks beside the replay pipeline, one command each: the proposer's speed (``drafter_speed``,
``das-trl bench drafter-speed``), the budget controller's (``controller_speed``), the drafter's memory against its
budgets (``history_memory``, ``live_memory``), the device's step cost model (``cost_profile``), the reward spread of
candidate tasks (``task_spread``) and recording rollouts for the replay (``record``, ``das-trl bench record``).
Nothing in the replay imports them."""
