"""`das-trl bench ...` turns bad user input (missing files, unknown drafters) into one clear line and exit code 2."""

import pathlib

from das_trl.cli import main as cli_main


def test_missing_sets_folder_is_one_line_and_exit_2(capsys):
    assert cli_main(["bench", "suite", "--sets", "/nonexistent-das-trl"]) == 2
    err = capsys.readouterr().err
    assert "das-trl bench suite: error: --sets: /nonexistent-das-trl does not exist" in err
    assert "Traceback" not in err


def test_missing_rollouts_file_is_one_line_and_exit_2(tmp_path, capsys):
    assert cli_main(["bench", "replay", "--rollouts", str(tmp_path / "missing.jsonl")]) == 2
    assert "das-trl bench replay: error:" in capsys.readouterr().err


def test_bad_cpu_knobs_are_one_line_and_exit_2(tmp_path, capsys):
    import pytest

    for flag, value, msg in (("--host-speed", "0", "must be a finite number > 0"),
                             ("--draft-threads", "0", "must be an int in")):
        with pytest.raises(SystemExit) as exc:
            cli_main(["bench", "suite", "--sets", str(tmp_path), flag, value])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {flag}: {msg}" in err and "Traceback" not in err


def test_bench_help_lists_the_benches_and_exits_0(capsys):
    for flag in ("--help", "-h"):
        assert cli_main(["bench", flag]) == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: das-trl bench [-h] {") and "replay" in out and "suite" in out


def test_cost_model_values_not_above_zero_are_named_before_any_set_is_loaded(tmp_path, capsys):
    # Checked as the options are parsed (every --c-tok of the suite's list too), before --sets / --rollouts is read:
    # the suite used to fail ~10 s in with LengthPolicyConfig's message. A missing path would be the error otherwise.
    import pytest

    cases = [("suite", "--sets", ["--c-tok", "0.025", "-0.5"], "--c-tok: must be a finite number > 0, got -0.5"),
             ("suite", "--sets", ["--c-tok", "0"], "--c-tok: must be a finite number > 0, got 0"),
             ("suite", "--sets", ["--c-base", "nan"], "--c-base: must be a finite number > 0, got nan"),
             ("suite", "--sets", ["--c-tok", "abc"], "--c-tok: must be a number, got 'abc'"),
             ("replay", "--rollouts", ["--c-tok", "-1"], "--c-tok: must be a finite number > 0, got -1")]
    for bench, where, args, shown in cases:
        with pytest.raises(SystemExit) as exc:
            cli_main(["bench", bench, where, str(tmp_path / "missing")] + args)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {shown}" in err, err
        assert "LengthPolicyConfig" not in err and "Traceback" not in err


def test_missing_realdata_folder_says_how_to_fetch_the_sets(tmp_path, capsys):
    missing = tmp_path / "shared" / "realdata"  # ../shared/realdata on a fresh machine
    assert cli_main(["bench", "suite", "--sets", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"das-trl bench suite: error: --sets: {missing} does not exist; " in err
    assert f"`bash scripts/fetch_realdata.sh --out {missing}`" in err and "~/.cache/das-trl/realdata" in err
    assert (pathlib.Path(__file__).parents[1] / "scripts" / "fetch_realdata.sh").is_file()
    # a file under such a folder: the folder is what the script fills
    assert cli_main(["bench", "suite", "--sets", str(missing / "set.jsonl.gz")]) == 2
    assert f"fetch_realdata.sh --out {missing}`" in capsys.readouterr().err


def test_empty_or_repeated_drafters_are_refused_before_any_set_is_loaded(tmp_path, capsys):
    # An empty list used to replay nothing and exit 0 (replay: the bounds only; suite: a row of nan); a drafter
    # listed twice was replayed twice. The sets do not exist: the drafters' error must come first.
    missing = str(tmp_path / "missing")
    for bench, where in (("replay", "--rollouts"), ("suite", "--sets")):
        for text, msg in (("", "no drafter given"), (" , ", "no drafter given"),
                          ("none,suffix,none", "'none' listed more than once")):
            assert cli_main(["bench", bench, where, missing, "--drafters", text]) == 2
            err = capsys.readouterr().err
            assert f"das-trl bench {bench}: error: --drafters: {msg}" in err and "Traceback" not in err


def test_unknown_bench_is_named(capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        cli_main(["bench", "bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "das-trl bench: error: unknown bench 'bogus'; name one of: replay," in err
    # the usage shown is the bench's, not the top-level one (which lists serve, doctor, ...)
    assert err.startswith("usage: das-trl bench [-h] {replay,") and "serve" not in err


def test_bench_help_says_what_each_bench_measures(capsys):
    # `das-trl bench --help` used to list the names alone: each now has its one-line description beside it
    import re

    assert cli_main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    names = re.match(r"usage: das-trl bench \[-h\] \{([^}]*)\}", out).group(1).split(",")
    assert len(names) == 10
    for name in names:
        assert re.search(rf"^ +{re.escape(name)}\s+\w.{{20,}}$", out, re.M), (name, out)  # a long name: next line


def test_early_appearance_below_minus_one_is_refused_at_parse_time(tmp_path, capsys):
    # -1 means "never"; -5 used to be accepted silently (and acted as -1)
    import pytest

    for value, shown in (("-5", "got '-5'"), ("x", "got 'x'")):
        with pytest.raises(SystemExit) as exc:
            cli_main(["bench", "suite", "--sets", str(tmp_path / "missing"), "--early-appearance", value])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert f"argument --early-appearance: must be an int >= -1 (-1: never), {shown}" in err, err
    from das_trl.bench import suite

    assert [suite.parse_args(["--sets", "x", "--early-appearance", v]).early_appearance for v in ("-1", "0", "7")] \
        == [-1, 0, 7]


def test_top_level_help_lists_the_benches_in_the_order_of_bench_help(monkeypatch, capsys):
    # `das-trl --help` used to list the benches by hand, in another order than `das-trl bench --help` (BENCHES)
    import re

    import pytest

    from das_trl.cli import BENCHES

    monkeypatch.setenv("COLUMNS", "400")  # one line: argparse would break "drafter-speed" at its hyphen
    with pytest.raises(SystemExit) as exc:
        cli_main(["--help"])
    assert exc.value.code == 0
    listed = re.search(r"`das-trl bench ([\w|-]+) \.\.\.`", capsys.readouterr().out).group(1).split("|")
    assert listed == list(BENCHES)
    assert cli_main(["bench", "--help"]) == 0
    usage = re.match(r"usage: das-trl bench \[-h\] \{([^}]*)\}", capsys.readouterr().out).group(1).split(",")
    assert usage == listed
