"""`das-trl bench cost-profile` refuses bad options as they are parsed (argparse's exit code 2, the flag named), before
any model is loaded: they used to end in a torch / transformers traceback or a cryptic message after the load."""

import pytest
import torch

from das_trl.bench.micro.cost_profile import parse_args
from das_trl.cli import main as cli_main

BAD = [
    (["--context", "-1"], "--context: must be an int >= 1, got '-1'"),
    (["--context", "0"], "--context: must be an int >= 1, got '0'"),
    (["--context", "abc"], "--context: must be an int >= 1, got 'abc'"),
    (["--repeats", "0"], "--repeats: must be an int >= 1, got '0'"),
    (["--batch", "abc"], "--batch: must be comma-separated ints >= 1, got 'abc'"),
    (["--batch", "1,,4"], "--batch: must be comma-separated ints >= 1, got '1,,4'"),
    (["--query", "0,4"], "--query: must be comma-separated ints >= 1, got '0,4'"),
    (["--device", "bogus"], "--device: must be cpu, cuda or cuda:N, got 'bogus'"),
    (["--device", "meta"], "--device: must be cpu, cuda or cuda:N"),
    (["--dtype", "float64"], "--dtype: invalid choice: 'float64'"),
    (["--model", "/nonexistent-das-trl"], "--model: local path '/nonexistent-das-trl' does not exist"),
    (["--model", "./nonexistent-das-trl"], "--model: local path './nonexistent-das-trl' does not exist"),
    (["--model", "~/nonexistent-das-trl"], "--model: local path '~/nonexistent-das-trl' does not exist"),
    (["--json", "/proc/das-trl/x.json"], "--json: cannot write /proc/das-trl/x.json"),
]


@pytest.mark.parametrize("args, shown", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_option_exits_2_naming_the_flag(args, shown, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["bench", "cost-profile"] + args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"das-trl bench cost-profile: error: argument {shown}" in err, err
    assert "Traceback" not in err


def test_model_folder_without_config_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["bench", "cost-profile", "--model", str(tmp_path)])
    assert exc.value.code == 2
    assert f"argument --model: folder '{tmp_path}' holds no config.json" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_cuda_without_cuda_says_so(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["bench", "cost-profile", "--device", "cuda"])
    assert exc.value.code == 2
    assert "argument --device: 'cuda': CUDA is not available on this machine" in capsys.readouterr().err


def test_good_options_parse_and_hub_names_pass_unchecked(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    args = parse_args(["--model", "Qwen/Qwen2.5-0.5B", "--batch", "1,2", "--query", "1", "--context", "16",
                       "--repeats", "1", "--device", "cpu", "--dtype", "bfloat16"])
    assert (args.model, args.batch, args.query, args.context, args.repeats, args.device, args.dtype) == \
        ("Qwen/Qwen2.5-0.5B", [1, 2], [1], 16, 1, "cpu", "bfloat16")
    assert parse_args(["--model", str(tmp_path)]).model == str(tmp_path)
    defaults = parse_args([])
    assert (defaults.batch, defaults.query, defaults.model, defaults.device) == ([1, 4, 16, 64], [1, 4, 8, 16], None,
                                                                                None)
