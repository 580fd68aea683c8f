"""Benchmarks. The replay pipeline, from the data to the page: ``sets`` (recorded rollouts, grouped into epochs;
``realdata`` fetches the third-party sets) -> ``drafters/`` (the drafters replayed) -> ``simulation`` (the
round-by-round continuous batch) -> ``reliability`` (predicted vs realised acceptance) -> ``point`` (a suite's replay
point) -> ``report`` (tables, JSON, plots) -> the commands ``replay`` and ``suite`` (sharing ``options``) ->
``suite_json``, ``figures`` and ``page`` (the benchmarks page). Beside it: ``live/`` (real vLLM engines) and
``micro/`` (stand-alone speed and memory benchmarks, cost profile, task survey, the rollout recorder)."""
