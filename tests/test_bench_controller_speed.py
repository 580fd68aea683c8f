"""`das-trl bench controller-speed --backend`: times the numpy reference or the native kernel, and says which ran."""

import pytest

from das_trl.cli import main as cli_main


def test_backend_python_times_the_numpy_reference(capsys):
    argv = ["bench", "controller-speed", "--batch", "4", "--problems", "8", "--repeats", "2"]
    assert cli_main(argv + ["--backend", "python"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "backend python: the numpy reference"
    assert len(out) == 2 and out[1].startswith("batch     4  K  16  median ")


def test_backend_default_is_auto_and_unknown_values_are_refused(capsys):
    from das_trl.drafter import native

    argv = ["bench", "controller-speed", "--batch", "4", "--problems", "8", "--repeats", "2"]
    assert cli_main(argv) == 0
    ran = "native kernel" if native.available() else "numpy reference"
    assert capsys.readouterr().out.splitlines()[0] == f"backend auto: the {ran}"
    with pytest.raises(SystemExit) as exc:
        cli_main(argv + ["--backend", "numpy"])
    assert exc.value.code == 2
    assert "argument --backend: invalid choice: 'numpy'" in capsys.readouterr().err


def test_values_out_of_range_are_refused_as_the_options_are_parsed(capsys):
    # --batch 0 was a ZeroDivisionError, --repeats 0 an IndexError, --k -3 / --problems 0 numpy's own message
    for flag, value, msg in (("--batch", "0", "must be comma-separated ints >= 1, got '0'"),
                             ("--batch", "64,0", "must be comma-separated ints >= 1, got '64,0'"),
                             ("--batch", "abc", "must be comma-separated ints >= 1, got 'abc'"),
                             ("--repeats", "0", "must be an int >= 1, got '0'"),
                             ("--k", "-3", "must be an int >= 1, got '-3'"),
                             ("--problems", "0", "must be an int >= 1, got '0'"),
                             ("--problems", "x", "must be an int >= 1, got 'x'")):
        with pytest.raises(SystemExit) as exc:
            cli_main(["bench", "controller-speed", flag, value])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert f"das-trl bench controller-speed: error: argument {flag}: {msg}" in err, err
        assert "Traceback" not in err


def test_help_shows_each_option_and_its_default_in_plain_text(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["bench", "controller-speed", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    assert "Cost of one BudgetController.budgets call (the per-engine-step controller) on this machine." in out
    assert ":meth:" not in out and "`" not in out
    for shown in ("(default 64,256,1024)", "(default 16)", "(default 2000)", "(default 200)"):
        assert shown in out, out
    for flag in ("--batch BATCH batch sizes", "--k K draft width", "--problems PROBLEMS synthetic problems",
                 "--repeats REPEATS timed calls"):
        assert flag in out, out
