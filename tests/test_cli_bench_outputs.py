"""Output options of the benches (--json, --plots, --cache, --out) are checked as the options are parsed: a path that
cannot be written is `argument --NAME: cannot write PATH (why)`, exit 2, before anything runs (a fresh-user check
found them failing only after the whole run, with the flag not named); and history-memory's missing --rollouts is the
one-line `error:` every das-trl command prints. No vLLM engine."""

import json
import sys

import pytest

from das_trl.bench import replay
from das_trl.cli import main as cli_main
from das_trl.drafter.rollout_log import append_records
from test_replay import _records

FORBIDDEN_FILE = "/proc/forbidden/x.json"  # /proc takes no new files, not even from root
FORBIDDEN_DIR = "/proc/forbidden"


@pytest.fixture
def rollouts(tmp_path):
    path = tmp_path / "sets" / "tiny.jsonl"
    append_records(path, _records(lambda e: 100 + e, problems=2, samples=2, epochs=2))
    return path


def _run(capsys, argv):
    """``cli_main(argv)`` -> (exit code, stderr, stdout), argparse's SystemExit included."""
    try:
        rc = cli_main([str(a) for a in argv])
    except SystemExit as exc:
        rc = exc.code
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return rc, captured.err, captured.out


def _no_engine(monkeypatch):
    """Make importing vLLM or transformers fail, so a bench that got past its options could not run quietly."""
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setitem(sys.modules, "transformers", None)


@pytest.mark.parametrize("argv, option, path", [
    (["bench", "replay", "--drafters", "none", "--json", FORBIDDEN_FILE], "--json", FORBIDDEN_FILE),
    (["bench", "replay", "--drafters", "none", "--plots", FORBIDDEN_DIR], "--plots", FORBIDDEN_DIR),
    (["bench", "suite", "--drafters", "none", "--json", FORBIDDEN_FILE], "--json", FORBIDDEN_FILE),
    (["bench", "suite", "--drafters", "none", "--plots", FORBIDDEN_DIR], "--plots", FORBIDDEN_DIR),
    (["bench", "suite", "--drafters", "none", "--cache", FORBIDDEN_DIR], "--cache", FORBIDDEN_DIR),
    (["bench", "history-memory", "--problems", "4", "--samples", "2", "--appearances", "2", "--length", "16",
      "--json", FORBIDDEN_FILE], "--json", FORBIDDEN_FILE),
    (["bench", "record", "--out", FORBIDDEN_FILE], "--out", FORBIDDEN_FILE),
])
def test_unwritable_output_is_refused_at_parse_time_naming_the_option(argv, option, path, rollouts, monkeypatch,
                                                                      capsys):
    _no_engine(monkeypatch)
    if argv[1] == "replay":
        argv = argv + ["--rollouts", rollouts]
    elif argv[1] == "suite":
        argv = argv + ["--sets", rollouts.parent]
    rc, err, out = _run(capsys, argv)
    assert rc == 2, (err, out)
    assert f"das-trl bench {argv[1]}: error: argument {option}: cannot write {path} (" in err
    assert out == ""  # nothing ran: no table, no JSON result


def test_task_spread_out_is_refused_at_parse_time(monkeypatch, capsys):
    from das_trl.bench.micro import task_spread

    _no_engine(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        task_spread.main(["--tasks", '[["chain_sum", {}]]', "--out", FORBIDDEN_FILE])
    assert exc.value.code == 2
    assert f"argument --out: cannot write {FORBIDDEN_FILE} (" in capsys.readouterr().err


def test_output_file_that_is_a_directory_and_a_folder_that_is_a_file(rollouts, tmp_path, capsys):
    rc, err, out = _run(capsys, ["bench", "replay", "--rollouts", rollouts, "--drafters", "none", "--json", tmp_path])
    assert rc == 2 and f"argument --json: cannot write {tmp_path} (it is a directory; give a file path)" in err
    assert out == ""
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    rc, err, out = _run(capsys, ["bench", "replay", "--rollouts", rollouts, "--drafters", "none", "--plots", a_file])
    assert rc == 2 and f"argument --plots: cannot write {a_file} (it exists and is not a folder)" in err
    rc, err, out = _run(capsys, ["bench", "history-memory", "--json", a_file / "x.json"])
    assert rc == 2 and f"argument --json: cannot write {a_file / 'x.json'} ({a_file} is not a folder)" in err
    assert out == ""


def test_the_check_creates_nothing_and_writable_new_folders_work(rollouts, tmp_path, capsys):
    out_json, plots = tmp_path / "new" / "deeper" / "r.json", tmp_path / "plots" / "here"
    argv = ["--rollouts", str(rollouts), "--drafters", "none,suffix", "--json", str(out_json), "--plots", str(plots)]
    replay.parse_args(argv)
    assert not (tmp_path / "new").exists() and not (tmp_path / "plots").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sets"]  # the write probe left nothing behind
    rc, err, out = _run(capsys, ["bench", "replay", *argv])
    assert rc == 0, err
    assert json.loads(out_json.read_text())["eval_epoch"] == 1 and list(plots.glob("*.png"))
    hm = tmp_path / "hm" / "result.json"
    rc, err, out = _run(capsys, ["bench", "history-memory", "--problems", "4", "--samples", "2", "--appearances", "2",
                                 "--length", "16", "--budget", "50", "--json", hm])
    assert rc == 0, err
    assert json.loads(hm.read_text())["budget_held"]


def test_history_memory_missing_rollouts_is_the_one_line_error(tmp_path, capsys):
    for path, what in ((tmp_path / "missing.jsonl", "no such file"), (tmp_path, "a directory")):
        rc, err, out = _run(capsys, ["bench", "history-memory", "--rollouts", path])
        assert rc == 2 and out == ""
        assert err.startswith(f"das-trl bench history-memory: error: --rollouts {path}: {what}; give a rollouts file")
        assert err.rstrip().endswith("(DAS_TRL_TRACEBACK=1 shows the traceback)") and err.count("\n") == 1


@pytest.mark.parametrize("args, shown", [
    (["--problems", "0"], "--problems: must be an int >= 1, got '0'"),
    (["--samples", "-2"], "--samples: must be an int >= 1, got '-2'"),
    (["--temperature", "nan"], "--temperature: must be a finite number >= 0, got nan"),
    (["--temperature", "warm"], "--temperature: must be a number, got 'warm'"),
    (["--dtype", "float64"], "--dtype: invalid choice: 'float64'"),
    (["--seed", "-1"], "--seed: must be an int in [0, 4294967295], got '-1'"),
    (["--force-not-given"], None),  # an existing --out without --force
])
def test_record_options_are_checked_before_the_engine_loads(args, shown, tmp_path, monkeypatch, capsys):
    """``bench record`` used to take ``--problems 0`` or a negative temperature to the engine, and refused an
    existing ``--out`` with a bare line and exit code 1."""
    _no_engine(monkeypatch)
    out = tmp_path / "r.jsonl"
    if shown is None:
        out.write_text("{}\n")
        args, shown = [], f"--out: {out} exists (--force overwrites it)"
    rc, err, stdout = _run(capsys, ["bench", "record", "--out", out] + args)
    assert rc == 2 and f"das-trl bench record: error: argument {shown}" in err, err
    assert stdout == ""


def test_record_takes_the_dtypes_and_seeds_vllm_takes(tmp_path):
    """``record`` starts a vLLM engine: it takes vLLM's dtype names (``auto``, ``half``, ...) as ``bench live`` does."""
    from das_trl.bench.micro.record import parse_args

    args = parse_args(["--out", str(tmp_path / "r.jsonl"), "--dtype", "half", "--seed", str(2**32 - 1)])
    assert (args.dtype, args.seed) == ("half", 2**32 - 1)
