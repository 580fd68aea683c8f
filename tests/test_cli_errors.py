"""Bad input to `das-trl bench replay` / `prepare-model` / `serve` gives one clear line and exit code 2, not a
traceback or a silently wrong result (found by a new-user check). Runs the real CLI in-process on a tiny file."""

import json
import signal

import pytest

from das_trl.cli import main as cli_main
from das_trl.drafter.rollout_log import RolloutRecord, append_records


@pytest.fixture
def rollouts(tmp_path):
    """3 epochs of 2 problems x 2 samples, short completions: a replay of it takes well under a second."""
    records = [RolloutRecord.make(e, float(e), [1, 2, 3 + p], [10 + p, 11, 12, 13 + s, 14], "stop")
               for e in range(3) for p in range(2) for s in range(2)]
    path = tmp_path / "rollouts.jsonl"
    append_records(path, records)
    return path


def _replay(capsys, *args):
    """``das-trl bench replay ARGS`` -> (exit code, stderr, stdout); argparse's own errors (SystemExit) included."""
    try:
        rc = cli_main(["bench", "replay", *map(str, args)])
    except SystemExit as exc:
        rc = exc.code
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return rc, captured.err, captured.out


def test_missing_rollouts_file_names_the_flag_and_where_rollouts_come_from(tmp_path, capsys):
    # It said "[Errno 2] No such file or directory: '...'" (the README's example before the main job has run).
    rc, err, _ = _replay(capsys, "--rollouts", tmp_path / "missing.jsonl")
    assert rc == 2 and f"--rollouts {tmp_path / 'missing.jsonl'}: no such file" in err and "das_record_rollouts" in err


def test_rollouts_directory_is_exit_2(tmp_path, capsys):
    rc, err, _ = _replay(capsys, "--rollouts", tmp_path)
    assert rc == 2 and f"{tmp_path} is a directory, not a rollouts file" in err


def test_unknown_das_config_and_controller_keys_are_exit_2(rollouts, capsys):
    rc, err, _ = _replay(capsys, "--rollouts", rollouts, "--das-config", '{"nope": 1}', "--drafters", "das-problem")
    assert rc == 2 and "--das-config: unknown DrafterConfig field 'nope'; valid fields: window," in err
    rc, err, _ = _replay(capsys, "--rollouts", rollouts, "--controller", '{"nope": 1}', "--drafters", "das+controller")
    assert rc == 2 and "--controller: unknown ControllerConfig field 'nope'; valid fields: c_base_ms," in err


def test_json_options_must_be_objects(rollouts, capsys):
    for flag, drafter in (("--controller", "das+controller"), ("--das-config", "das-problem"),
                          ("--policy", "das+policy")):
        rc, err, _ = _replay(capsys, "--rollouts", rollouts, flag, "[1]", "--drafters", drafter)
        assert rc == 2 and f"{flag} must be a JSON object" in err and "got list" in err


def test_train_epochs_must_precede_the_eval_epoch(rollouts, capsys):
    # The eval epoch in its own history leaked its completions (das-problem drafted them perfectly); a later epoch
    # would leak the future the same way.
    for train, ev in (("2", "2"), ("0,2", "1")):
        rc, err, _ = _replay(capsys, "--rollouts", rollouts, "--train-epochs", train, "--eval-epoch", ev,
                          "--drafters", "none,das-problem")
        assert rc == 2 and f"are not before the eval epoch {ev}" in err
    rc, err, _ = _replay(capsys, "--rollouts", rollouts, "--train-epochs", "0,0", "--eval-epoch", "2")
    assert rc == 2 and "argument --train-epochs: lists an epoch twice" in err


def test_ngram_format_is_checked(rollouts, capsys):
    for value, msg in (("5,2,0", "needs 1 <= prompt_lookup_min <= prompt_lookup_max"), ("1,2", "must be MIN,MAX,K"),
                       ("0,2,3", "needs 1 <= prompt_lookup_min"), ("2,2,0", "num_speculative_tokens must be >= 1")):
        rc, err, _ = _replay(capsys, "--rollouts", rollouts, "--ngram", value, "--drafters", "ngram")
        assert rc == 2 and f"argument --ngram: {msg}" in err


def test_unwritable_cache_names_das_trl_cache(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("DAS_TRL_CACHE", str(tmp_path / "file" / "cache"))  # a path under a file: mkdir fails
    assert cli_main(["prepare-model"]) == 2
    err = capsys.readouterr().err
    assert f"das-trl prepare-model: error: cannot create the model cache folder {tmp_path / 'file' / 'cache'}" in err
    assert "DAS_TRL_CACHE" in err and "Traceback" not in err


def test_version(capsys):
    """``das-trl --version`` prints the package's version (it used to fail: the command was required)."""
    import das_trl

    with pytest.raises(SystemExit) as exc:
        cli_main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out == f"das-trl {das_trl.__version__}\n"


def test_ctrl_c_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    """Ctrl-C during a command (here the model's conversion) used to end in a traceback from wherever it landed
    (transformers, scipy) and exit code 1; DAS_TRL_TRACEBACK=1 still shows it."""
    from das_trl.defaults import model as model_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(model_module, "prepare_default_model", interrupted)
    try:
        rc = cli_main(["prepare-model", "--cache-dir", str(tmp_path)])
    except KeyboardInterrupt:  # a failure of this test, not an interrupt of the whole test run
        pytest.fail("Ctrl-C escaped das-trl's entry point")
    assert rc == 130
    err = capsys.readouterr().err
    assert err.strip() == "das-trl prepare-model: interrupted"
    monkeypatch.setenv("DAS_TRL_TRACEBACK", "1")
    with pytest.raises(KeyboardInterrupt):
        cli_main(["prepare-model", "--cache-dir", str(tmp_path)])


def test_bad_record_names_file_and_line(rollouts, capsys):
    lines = rollouts.read_text().splitlines()
    record = json.loads(lines[4])
    record["completion_ids"][1] = 2**31
    lines[4] = json.dumps(record)
    rollouts.write_text("\n".join(lines[:2] + [""] + lines[2:]) + "\n")  # a blank line: line 6 holds record 4
    rc, err, _ = _replay(capsys, "--rollouts", rollouts, "--drafters", "none")
    assert rc == 2 and f"{rollouts}:6: completion_ids token ids must lie in [0, 2**31)" in err


def test_serve_startup_interrupted_is_not_blamed_on_the_server():
    from das_trl.vllm.serve import startup_failure

    exc = RuntimeError("the vLLM server exited with code 1 before becoming healthy")
    msg = startup_failure(exc, signal.SIGTERM)
    assert msg.startswith("startup interrupted by SIGTERM") and "exited with code" not in msg
    assert startup_failure(exc, signal.SIGINT).startswith("startup interrupted by SIGINT")
    assert startup_failure(exc, None) == f"startup failed: {exc}"


@pytest.mark.parametrize("config,names", [('{"nope": 1}', "nope"), ("[1]", "JSON object"),
                                          ('{"max_spec_factor": Infinity}', "max_spec_factor"),
                                          ('{"budget_controller": {"nope": 1}}', "nope"),
                                          ('{"max_tree_depth": 5000}', "max_tree_depth")])  # the native core's limit
def test_serve_rejects_a_bad_drafter_config_before_starting_anything(config, names, monkeypatch, caplog):
    # The engine refused these only after its start-up (minutes); serve now checks them first.
    import subprocess

    from das_trl.vllm import serve

    def no_server(*args, **kwargs):
        raise AssertionError("a server was started for a config that cannot attach")

    monkeypatch.setattr(subprocess, "Popen", no_server)
    monkeypatch.setattr(serve, "prepare_default_model", no_server, raising=False)
    assert serve.main(["--model", "unused", "--drafter-config", config]) == 2
    assert "invalid --drafter-config" in caplog.text and names in caplog.text


def test_replay_help_names_the_command(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["bench", "replay", "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and out.startswith("usage: das-trl bench replay ")
    assert "'appearance' (default): the k-th training step in which a problem appears is its epoch k" in " ".join(
        out.split())


def test_valid_replay_still_runs(rollouts, capsys):
    rc, err, out = _replay(capsys, "--rollouts", rollouts, "--train-epochs", "1,0", "--eval-epoch", "2", "--ngram",
                           "1,2,3", "--drafters", "none,ngram,das-problem", "--das-config", '{"max_spec_factor": 1.0}')
    assert rc == 0, err
    assert "history epochs [0, 1]" in out and "replaying epoch 2" in out  # history sorted oldest first


def test_second_check_findings_are_exit_2_before_any_replay(rollouts, tmp_path, capsys):
    # A second new-user check: a corrupt .gz, --json at a directory (failed after the whole replay), nan or negative
    # --async-off-ms (a table of nan), inf --host-speed, and DrafterConfig values past what the native core holds.
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_bytes(b"\x1f\x8bxx")
    rc, err, _ = _replay(capsys, "--rollouts", corrupt, "--drafters", "none")
    assert rc == 2 and "cannot read the rollouts file" in err
    rc, err, out = _replay(capsys, "--rollouts", rollouts, "--drafters", "none", "--json", tmp_path)
    assert rc == 2 and "is a directory; give a file path" in err and "history epochs" not in out
    for flag, value in (("--async-off-ms", "nan"), ("--async-off-ms", "-5"), ("--host-speed", "inf")):
        rc, err, _ = _replay(capsys, "--rollouts", rollouts, "--drafters", "none", flag, value)
        assert rc == 2 and "must be a finite number" in err, (flag, value)
    rc, err, out = _replay(capsys, "--rollouts", rollouts, "--drafters", "none,das+siblings", "--das-config",
                           '{"live_token_budget": 100000000000000000000000}')
    assert rc == 2 and "live_token_budget must be an int in [0, " in err and "history epochs" not in out


# ------------------------------------------------------------------- das-trl serve / doctor / bench page (new-user check)
def _no_process(*args, **kwargs):
    raise AssertionError("a process was started for arguments that cannot run")


@pytest.mark.parametrize("argv,says", [
    (["--port", "99999"], "--port 99999: allowed 1..65535"),
    (["--model", "/nonexistent/das-trl/model"], "--model /nonexistent/das-trl/model: no such file or folder"),
    (["--model", "./no-such-model-dir"], "--model ./no-such-model-dir: no such file or folder"),
    (["--gpu-memory-utilization", "7"], "--gpu-memory-utilization 7.0: allowed a fraction above 0 and at most 1"),
    (["--pipeline-parallel-size", "two"], "argument --pipeline-parallel-size/-pp: invalid int value: 'two'"),
    (["--print-trl-command", "--drafter-config", '{"window": 4}'], "--drafter-config cannot travel through trl"),
    # flags that would replace DAS's own (vLLM keeps the last value): the server would start and never attach
    (["--speculative-config", '{"method": "suffix"}'], "--speculative-config: das-trl serve sets"),
    (["--print-trl-command", '--speculative_config={"method": "ngram"}'], "--speculative-config: das-trl serve sets"),
    (["--speculative-config.num_speculative_tokens", "8"], "--speculative-config: das-trl serve sets"),
    (["--spec-tokens", "8"], "--spec-tokens: das-trl serve sets"),
    (["--worker-extension-cls", "my.Ext"], "--worker-extension-cls: das-trl serve sets"),
    (["--max-num-seqs", "0"], "--max-num-seqs 0: allowed 1 or more"),
    (["--data-parallel-size", "-1"], "--data-parallel-size -1: allowed 1 or more"),
    (["--max-payload-bytes", "0"], "--max-payload-bytes 0: allowed 1 or more"),
])
def test_serve_refuses_bad_settings_in_one_line_before_starting_anything(argv, says, monkeypatch, caplog, capsys):
    import subprocess

    from das_trl.vllm import serve

    monkeypatch.setattr(subprocess, "Popen", _no_process)
    assert serve.main(["--model", "unused", *argv]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and says in errors[0] and "\n" not in errors[0], errors
    assert "usage:" not in capsys.readouterr().err


def test_serve_refuses_a_model_folder_without_a_config(tmp_path, monkeypatch, caplog):
    # vLLM would start up (imports, a worker) before finding no config.json in it.
    import subprocess

    from das_trl.vllm import serve

    monkeypatch.setattr(subprocess, "Popen", _no_process)
    assert serve.main(["--model", str(tmp_path), "--print-trl-command"]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and f"--model {tmp_path}: a folder without a model config" in errors[0], errors
    (tmp_path / "config.json").write_text("{}")
    args = serve.build_parser().parse_args(["--model", str(tmp_path)])
    assert serve.check_serve_args(args) == []


def test_serve_lets_hub_names_through_and_parses_flags_in_one_line(capsys):
    from das_trl.vllm import serve

    args = serve.build_parser().parse_args(["--model", "Qwen/Qwen2.5-Math-1.5B"])
    assert serve.check_serve_args(args) == []  # a hub name is vLLM's to download
    assert serve.looks_local("models/qwen/ckpt") and serve.looks_local("~/m") and not serve.looks_local("gpt2")
    with pytest.raises(SystemExit) as exc:
        serve.main(["--port", "abc"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert err.startswith("das-trl serve: error: argument --port: invalid int value: 'abc'")


def _fake_server(tmp_path, lines: list[str], code: int) -> "subprocess.Popen":
    """A process that prints ``lines`` (as a server's log) and exits with ``code`` (negative: kills itself)."""
    import subprocess
    import sys

    script = tmp_path / "server.py"
    end = f"os.kill(os.getpid(), {-code})" if code < 0 else f"sys.exit({code})"
    script.write_text("import os, sys\n" + "".join(f"print({line!r}, flush=True)\n" for line in lines) + end + "\n")
    return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_serve_reports_a_server_that_stops_by_itself_with_its_cause(tmp_path, caplog, capsysbinary):
    # vLLM's server exits 0 when an engine process of a data-parallel server dies; das-trl serve exited 0 in silence.
    import io

    from das_trl.vllm.serve import serve_until_exit
    from das_trl.vllm.server_output import OutputTail

    log = ["INFO 12-03 22:40:00 [api_server.py:1] Started server process",
           "ERROR 12-03 22:41:02 [async_llm.py:480] AsyncLLM output_handler failed.",
           "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above)",
           "WARNING 12-03 22:41:02 [core_client.py:818] [shutdown] MPClient: engine core exited unexpectedly; "
           "starting cleanup",
           "INFO:     Shutting down"]
    for code, rc, words in ((0, 1, "exit code 0"), (3, 3, "exit code 3"), (-9, 137, "signal SIGKILL")):
        caplog.clear()
        process = _fake_server(tmp_path, log, code)
        copied = io.BytesIO()
        output = OutputTail()
        output.follow(process.stdout, copied)
        output.follow(process.stderr, io.BytesIO())
        assert serve_until_exit(process, [], output) == rc
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and "\n" not in errors[0]
        assert f"stopped while serving ({words})" in errors[0] and "engine core exited unexpectedly" in errors[0]
        assert b"Started server process" in copied.getvalue()  # the server's output still reaches the user
    # Stopped on request (Ctrl-C / SIGTERM forwarded): the server's own exit code, no error line.
    caplog.clear()
    process = _fake_server(tmp_path, ["INFO:     Shutting down"], 0)
    output = OutputTail()
    output.follow(process.stdout, io.BytesIO())
    assert serve_until_exit(process, [15], output) == 0
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_bench_page_refuses_an_img_folder_under_a_file_before_writing_pages(tmp_path, capsys):
    # It rewrote the pages, then failed with a traceback when drawing the figures.
    from pathlib import Path

    suite = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "suite.json.gz"
    page = tmp_path / "page.md"
    page.write_text("<!-- bench:cost-table:start -->\nold\n<!-- bench:cost-table:end -->\n")
    (tmp_path / "file").write_text("")
    img = tmp_path / "file" / "img"
    rc = cli_main(["bench", "page", "--json", str(suite), "--pages", str(page), "--img", str(img)])
    err = capsys.readouterr().err
    assert rc == 2 and f"das-trl bench page: error: --img {img}: {tmp_path / 'file'} is a file" in err
    assert "Traceback" not in err and "old" in page.read_text()  # nothing was rewritten


def test_doctor_server_accepts_an_address_without_http(monkeypatch, capsys):
    from das_trl import doctor

    seen = []
    monkeypatch.setattr(doctor, "run_checks", lambda server_url=None: seen.append(server_url) or [])
    assert doctor.main(["--server", "localhost:8000"]) == 0
    assert seen == ["http://localhost:8000"]
    with pytest.raises(SystemExit) as exc:
        doctor.main(["--server", "ftp://localhost:8000"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--server: server address 'ftp://localhost:8000'" in err
    assert err.count("\n") == 1 and "usage:" not in err  # one line, as das-trl serve's


@pytest.mark.parametrize("argv,says", [
    (["--max-num-seqs", "-1"], "--max-num-seqs -1: allowed 1 or more"),  # vLLM's config refused it after start-up
    (["--prompts", "0"], "--prompts 0: allowed 1 or more"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization 1.5: allowed a fraction"),
    (["--temperature", "nan"], "--temperature nan: allowed a finite number >= 0"),
    (["--time-limit", "0"], "--time-limit 0.0: allowed a positive number of seconds"),
])
def test_bench_live_refuses_bad_sizes_before_any_engine(argv, says, monkeypatch, tmp_path, capsys):
    from das_trl.bench.live import run

    monkeypatch.setattr(run, "run_live", _no_process)
    rc = cli_main(["bench", "live", "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and f"das-trl bench live: error: {says}" in err, err


def test_bench_live_refuses_an_out_folder_under_a_file_before_the_run(monkeypatch, tmp_path, capsys):
    # The results were written after every batch had run: a file in the way failed then, with a traceback.
    from das_trl.bench.live import run

    monkeypatch.setattr(run, "run_live", _no_process)
    (tmp_path / "file").write_text("")
    rc = cli_main(["bench", "live", "--out", str(tmp_path / "file" / "live")])
    err = capsys.readouterr().err
    assert rc == 2 and f"{tmp_path / 'file'} is a file, so the results could not be written there" in err, err


def test_prepare_model_help_explains_cache_dir_and_force(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["prepare-model", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    assert "--cache-dir CACHE_DIR folder to keep the converted model in (default: $DAS_TRL_CACHE, else " \
           "~/.cache/das-trl)" in out, out
    assert "--force convert again even if the model is already prepared there, replacing it" in out, out
