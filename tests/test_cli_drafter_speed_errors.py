"""``das-trl bench drafter-speed`` checks its options as they are parsed: a bad value exits 2 with argparse's
``argument --NAME: ...`` line before the table header prints or anything runs.

Before, ``--rounds 0`` crashed (``UnboundLocalError``), ``--compare bogus``, ``--samples -3``, ``--push-tokens -5`` and
``--skip garbage`` ran with exit 0, and ``--batch abc``, ``--context -5``, ``--vocab 0`` and ``--k 0`` failed after
the header with messages that did not name the option.
"""

import pytest

from das_trl.cli import main as cli_main

BAD = [
    (["--rounds", "0"], "--rounds", "must be an int >= 1, got '0'"),
    (["--rounds", "-1"], "--rounds", "must be an int >= 1, got '-1'"),
    (["--compare", "bogus"], "--compare", "invalid choice: 'bogus'"),
    (["--batch", "abc"], "--batch", "must be comma-separated ints >= 1, got 'abc'"),
    (["--batch", "4,0"], "--batch", "must be comma-separated ints >= 1, got '4,0'"),
    (["--context", "-5", "--batch", "4", "--rounds", "1"], "--context", "must be comma-separated ints >= 64"),
    (["--context", "1024,63"], "--context",
     "must be comma-separated ints >= 64 (the prompt's tokens included), got '1024,63'"),
    (["--vocab", "0"], "--vocab", "must be an int in [2, 2147483648], got '0'"),
    (["--k", "0"], "--k", "must be an int in [1, 64], got '0'"),
    (["--k", "65"], "--k", "must be an int in [1, 64], got '65'"),
    (["--samples", "-3"], "--samples", "must be an int >= 1, got '-3'"),
    (["--appearances", "0"], "--appearances", "must be an int >= 1, got '0'"),
    (["--push-tokens", "-5"], "--push-tokens", "must be an int >= 0, got '-5'"),
    (["--history-tokens", "-5"], "--history-tokens", "must be an int >= 0, got '-5'"),
    (["--warmup-rounds", "-1"], "--warmup-rounds", "must be an int >= 0, got '-1'"),
    (["--seed", "-1"], "--seed", "must be an int >= 0, got '-1'"),
    (["--skip", "garbage"], "--skip", "must be comma-separated BATCHxCONTEXT items"),
    (["--skip", "256x1024,1024x"], "--skip",
     "must be comma-separated BATCHxCONTEXT items, e.g. 1024x16384, got '256x1024,1024x'"),
    (["--forward-ms", "nan"], "--forward-ms", "must be a number of ms in [0, 60000], got 'nan'"),
    (["--forward-ms", "-1"], "--forward-ms", "must be a number of ms in [0, 60000], got '-1'"),
]


@pytest.mark.parametrize("args,flag,message", BAD, ids=[" ".join(a) for a, _, _ in BAD])
def test_a_bad_option_exits_2_naming_it_before_anything_runs(args, flag, message, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line: argparse would wrap the message
    with pytest.raises(SystemExit) as exc:
        cli_main(["bench", "drafter-speed", *args])
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""  # not even the table header
    assert f"das-trl bench drafter-speed: error: argument {flag}: {message}" in err, err


def _parsed(argv, monkeypatch):
    """The options ``drafter_speed.main(argv)`` parses, without running the benchmark."""
    import argparse

    from das_trl.bench.micro import drafter_speed

    parse, seen = argparse.ArgumentParser.parse_args, []

    def spy(self, *a, **kw):
        seen.append(parse(self, *a, **kw))
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", spy)
    with pytest.raises(SystemExit):
        drafter_speed.main(argv)
    monkeypatch.undo()
    return seen[0]


def test_the_lists_parse_and_the_defaults_hold(monkeypatch):
    args = _parsed([], monkeypatch)
    assert (args.batch, args.context, args.skip, args.compare) == ([256, 1024], [1024, 16384], set(), "suffix")
    assert (args.rounds, args.k, args.vocab, args.warmup_rounds, args.forward_ms) == (20, 16, 32000, 5, 0.0)
    args = _parsed(["--batch", "4,8", "--context", "64,128", "--skip", "4x128, 8x64", "--k", "64", "--vocab", "2",
                    "--push-tokens", "0", "--warmup-rounds", "0", "--forward-ms", "7"], monkeypatch)
    assert (args.batch, args.context, args.skip) == ([4, 8], [64, 128], {(4, 128), (8, 64)})
    assert (args.k, args.vocab, args.push_tokens, args.warmup_rounds, args.forward_ms) == (64, 2, 0, 0, 7.0)


def test_a_small_run_skips_what_skip_names(capsys):
    from das_trl.bench.micro import drafter_speed

    assert drafter_speed.main(["--batch", "4", "--context", "64,96", "--skip", "4x96", "--rounds", "2",
                               "--push-tokens", "0", "--history-tokens", "10000", "--compare", "none"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [("4", "64", "das")]
