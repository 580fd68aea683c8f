"""The benchmarks page's figures, drawn from the suite's JSON (:mod:`das_trl.bench.page` calls :func:`write_figures`).

``bench_headline.png``: running requests over the time with the CPU (cost model, ms -> s) on the headline replay
points (:data:`~das_trl.bench.suite_json.HEADLINE_SETS`), for ``none``, ``suffix``, the default and ``oracle-text``, from each
point's ``traces`` (:func:`das_trl.bench.report.running_trace`). ``bench_by_set.png``: per replay point, the time
with the CPU / ``none`` of ``suffix``, the default and every bound. ``bench_reliability.png``: the default's predicted
vs realised acceptance per draft position bucket. All at the page's reference cost model; small
PNGs (about 100 dpi, no timestamp), so a regeneration from the same JSON changes nothing but what moved.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from das_trl.bench.suite_json import (BY_SET_PNG, HEADLINE_PNG, HEADLINE_SETS, RELIABILITY_PNG, bound_names,
                                     c_tok_key, find_point, ratio, reliability_points)
from das_trl.bench.report import DEFAULT

#: Line / bar style per method (label, colour, line style, width).
STYLE = {"none": ("none", "0.45", "-", 1.4), "suffix": ("vLLM suffix", "tab:orange", "-", 1.4),
         DEFAULT: ("das-trl default", "tab:blue", "-", 2.2),
         "oracle-trim": ("oracle-trim (bound)", "tab:green", ":", 1.4),
         "oracle-text": ("oracle-text (bound)", "tab:green", "--", 1.2)}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    _plt().close(fig)
    return str(path)


def headline(payload: dict, path: Path, sets: Sequence[str] = HEADLINE_SETS, default: str = DEFAULT) -> str | None:
    """Running requests over the time with the CPU, one panel per headline set that has traces; None if none has."""
    c = c_tok_key(payload)
    panels = []
    for name in sets:
        p = find_point(payload, name)
        tr = (p or {}).get("by_c_tok", {}).get(c, {}).get("traces") or {}
        if tr:
            panels.append((p, tr))
    if not panels:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.3), squeeze=False)
    for ax, (p, tr) in zip(axes[0], panels):
        for name in ("none", "suffix", default, "oracle-text"):
            pts = tr.get(name)
            if not pts:
                continue
            label, colour, ls, lw = STYLE.get(name, (name, None, "-", 1.2))
            t, n = zip(*pts)
            r = ratio(p, c, name, "time_cpu_vs_none")
            if name != "none" and math.isfinite(r):
                label = f"{label}: {r:.2f}x"
            ax.step([x / 1000.0 for x in t], n, where="post", label=label, color=colour, ls=ls, lw=lw)
        ax.set_title(f"{p['name']} ({p.get('requests', '?')} requests)", fontsize=9)
        ax.set_xlabel("cost-model time with the drafter's CPU (s)", fontsize=8)
        ax.set_ylabel("running requests", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, frameon=False)
    fig.suptitle(f"Rollout batch draining (cost model {payload.get('c_base_ms', 7):g} ms + {float(c):g} ms/token; "
                 "legend: time vs none)", fontsize=9)
    return _save(fig, path)


def by_set(payload: dict, path: Path, default: str = DEFAULT) -> str:
    """Per replay point: the time with the CPU / none of suffix, the default and every bound (horizontal bars)."""
    import numpy as np

    c = c_tok_key(payload)
    names = ["suffix", default] + bound_names(payload, c)
    points = payload["points"]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.2, 0.5 + 0.55 * len(points)))
    h = 0.8 / len(names)
    y = np.arange(len(points))[::-1].astype(float)
    for j, name in enumerate(names):
        label, colour, _, _ = STYLE.get(name, (name, None, "-", 1.0))
        vals = [ratio(p, c, name, "time_cpu_vs_none") for p in points]
        ax.barh(y + 0.4 - (j + 0.5) * h, [v if math.isfinite(v) else 0.0 for v in vals], h, label=label,
                color=colour, alpha=1.0 if name in ("suffix", default) else 0.45 + 0.2 * (j % 2),
                hatch=None if name in ("suffix", default) else "//" if j % 2 else "")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.text(1.0, len(points) - 0.45, " none", fontsize=7, va="bottom")
    ax.set_yticks(y, [p["name"] for p in points], fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel("time with the drafter's CPU / none (lower is faster; bounds without CPU)", fontsize=8)
    ax.set_title(f"Every replay point (cost model c_tok {float(c):g} ms/token)", fontsize=9)
    ax.legend(fontsize=7, frameon=False, loc="lower right")
    return _save(fig, path)


def reliability(payload: dict, path: Path) -> str | None:
    """The default's predicted vs realised acceptance per draft position bucket on every point
    (:func:`das_trl.bench.reliability.write_reliability_plot`); ``None`` when the JSON carries none."""
    from das_trl.bench.reliability import write_reliability_plot

    found = [(name, rel) for name, rel in reliability_points(payload)
             if isinstance(rel, dict) and any(b.get("tokens") for b in rel.get("buckets", []))]
    return str(write_reliability_plot(found, path)) if found else None


def write_figures(payload: dict, outdir: Path) -> list[str]:
    """The figures into ``outdir``; returns the paths written."""
    out = [headline(payload, outdir / HEADLINE_PNG), by_set(payload, outdir / BY_SET_PNG),
           reliability(payload, outdir / RELIABILITY_PNG)]
    return [f for f in out if f]
