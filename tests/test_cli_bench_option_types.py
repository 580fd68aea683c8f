"""Bad option values of `das-trl bench history-memory / live / realdata` and of `python -m
das_trl.bench.micro.live_memory / task_spread` are argparse's usage error (exit 2, `argument --OPT: ...`) as the
options are parsed: nothing is built, loaded or downloaded (they reached the code before, which failed there, after
work had started, or ran with them)."""

from __future__ import annotations

import pytest

from das_trl.cli import main as cli_main

CLI_BAD = [
    ("history-memory", "--problems", "0"),
    ("history-memory", "--samples", "-1"),
    ("history-memory", "--appearances", "0"),
    ("history-memory", "--length", "0"),
    ("history-memory", "--window", "0"),
    ("history-memory", "--budget", "-5"),
    ("history-memory", "--budget", "0"),
    ("history-memory", "--problems-per-step", "0"),
    ("history-memory", "--seed", "-1"),
    ("history-memory", "--max-tree-depth", "0"),
    ("history-memory", "--problems", "nan"),
    ("live", "--num-speculative-tokens", "0"),
    ("live", "--num-speculative-tokens", "1000"),
    ("live", "--num-speculative-tokens", "x"),
    ("live", "--seed", "-1"),
    ("live", "--seed", str(2**32)),
    ("live", "--drafters", "das,foo"),
    ("live", "--drafters", "das,das"),
    ("live", "--drafters", ","),
    ("live", "--dtype", "fp8"),
    ("realdata", "--out", "{file}/sub"),
    ("realdata", "--sources", "{file}"),
]


@pytest.mark.parametrize("bench,option,value", CLI_BAD)
def test_bad_bench_option_is_a_usage_error(bench, option, value, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exc:
        cli_main(["bench", bench, option, value.format(file=tmp_path / "file")])
    out, err = capsys.readouterr()
    assert exc.value.code == 2
    assert f"das-trl bench {bench}: error: argument {option}:" in err, err
    assert "Traceback" not in err and out == ""


MODULE_BAD = [
    ("live_memory", "--requests", "0"),
    ("live_memory", "--prompt", "-1"),
    ("live_memory", "--output", "0"),
    ("live_memory", "--piece", "0"),
    ("live_memory", "--seed", "-1"),
    ("task_spread", "--problems", "0"),
    ("task_spread", "--samples", "-2"),
    ("task_spread", "--max-tokens", "0"),
    ("task_spread", "--temperature", "-0.1"),
    ("task_spread", "--temperature", "nan"),
    ("task_spread", "--seed", "-1"),
    ("task_spread", "--dtype", "fp8"),
    ("task_spread", "--rewards", "correctness"),
    ("task_spread", "--tasks", "not json"),
    ("task_spread", "--tasks", '{"chain_sum": {}}'),
]


@pytest.mark.parametrize("module,option,value", MODULE_BAD)
def test_bad_micro_bench_option_is_a_usage_error(module, option, value, capsys):
    import importlib

    mod = importlib.import_module(f"das_trl.bench.micro.{module}")
    argv = [option, value] if option == "--tasks" else ["--tasks", '[["chain_sum", {}]]', option, value]
    if module == "live_memory":
        argv = [option, value]
    with pytest.raises(SystemExit) as exc:
        mod.main(argv)
    out, err = capsys.readouterr()
    assert exc.value.code == 2
    assert f"das_trl.bench.micro.{module}: error: argument {option}:" in err, err
    assert "Traceback" not in err and out == ""


def test_defaults_still_parse():
    from das_trl.bench.live.run import parse_args as live_args
    from das_trl.bench.micro.task_spread import parse_args as spread_args

    args = live_args([])
    assert args.seed == 0 and args.dtype == "float32" and args.num_speculative_tokens == 64
    args = spread_args(["--tasks", '[["chain_sum", {}]]'])
    assert args.tasks == [["chain_sum", {}]] and args.rewards == ["rg_correctness", "equation"]
    assert args.temperature == 0.8 and args.seed == 0
