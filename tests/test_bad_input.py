"""Bad input on the command line: every case exits 2 with ONE line on stderr, no traceback,
and leaves what an earlier run wrote untouched. Add a row to BAD_INPUTS for each new check."""

import hashlib
import shutil
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedjax_pfl.runs import cli as train
from fedjax_pfl.engine import checkpoint
from fedjax_pfl.data import files
from fedjax_pfl.core.errors import UserError

TINY = ["--dataset", "synthetic", "--model", "mlr", "--num-clients", "6", "--partition", "natural",
        "--local-epochs", "1", "--rounds", "2", "--no-progress", "--offline"]


def _run(argv, capsys):
    code = train.main(argv)
    return code, capsys.readouterr().err


def _assert_one_line_error(code, err, needle):
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert needle.lower() in err.lower(), err


def _tree_digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished 2-round FedAvg run with a checkpoint every round."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert train.main(["--method", "fedavg", *TINY, "--checkpoint-every", "1", "--out", str(out)]) == 0
    return out


def _array_files(folder: Path) -> list[Path]:
    """The files of a checkpoint that hold array data (Orbax's OCDBT data files)."""
    found = [p for p in folder.rglob("*") if p.is_file() and p.parent.name == "d"]
    assert found, f"no array data files under {folder}"
    return found


def _setup(tmp_path: Path, finished_run: Path) -> dict:
    """Files the table refers to: {name} placeholders in its arguments."""
    (tmp_path / "bad.yaml").write_text("train:\n  lr: [0.1,\n")
    (tmp_path / "a_file").write_text("x")
    empty = tmp_path / "empty"
    empty.mkdir()
    runs = {}
    for name, damage in (("truncated", lambda b: b[: len(b) // 2]), ("corrupted", lambda b: b"\0" * 64 + b[64:])):
        copy = tmp_path / name
        shutil.copytree(finished_run, copy)
        for data in _array_files(checkpoint.checkpoint_path(copy)):
            data.write_bytes(damage(data.read_bytes()))
        runs[name] = copy
    return {"tmp": tmp_path, "empty": empty, "finished": finished_run, **runs}


BAD_INPUTS = [  # (id, argv, needle in the message)
    ("yaml_syntax", ["--method", "fedavg", "--config", "{tmp}/bad.yaml"], "not valid YAML at line"),
    ("out_is_a_file", ["--method", "fedavg", *TINY, "--out", "{tmp}/a_file"], "is a file"),
    ("out_under_a_file", ["--method", "fedavg", *TINY, "--out", "{tmp}/a_file/run"], "which is a file"),
    ("out_not_writable", ["--method", "fedavg", *TINY, "--out", "/sys/fedjax_pfl_run"], "cannot write"),
    ("unknown_client_mapping", ["--method", "fedavg", *TINY, "--client-mapping", "nosuch"], "unknown client mapping"),
    ("negative_momentum", ["--method", "fedavg", *TINY, "--momentum", "-1"], "train.momentum"),
    ("negative_checkpoint_every", ["--method", "fedavg", *TINY, "--checkpoint-every", "-1"], "checkpoint_every"),
    ("negative_fedprox_mu", ["--method", "fedprox", *TINY, "method.mu=-1"], "method.mu"),
    ("unknown_option", ["--method", "fedavg", *TINY, "--nosuch", "3"], "unrecognized arguments: --nosuch"),
    ("flag_needs_a_number", ["--method", "fedavg", *TINY, "--lr", "fast"], "--lr"),
    ("bad_override_yaml", ["--method", "fedavg", *TINY, "train.lr=[1,"], "not valid YAML"),
    ("shared_body_on_mlr", ["--method", "fedper", *TINY], "no body parameters"),
    ("eval_model_not_offered", ["--method", "fedavg", *TINY, "--eval-model", "local"], "eval.model"),
    ("data_dir_missing", ["--method", "fedavg", "--dataset", "mnist", "--data-dir", "{tmp}/nonexistent"],
     "is not a folder"),
    ("resume_nothing_there", ["--method", "fedavg", *TINY, "--out", "{empty}", "--resume"], "nothing to resume"),
    ("resume_without_out", ["--method", "fedavg", *TINY, "--resume"], "--resume needs --out"),
    ("resume_truncated_checkpoint", ["--method", "fedavg", *TINY, "--checkpoint-every", "1", "--out", "{truncated}",
                                     "--resume", "--rounds", "3"], "truncated or corrupted"),
    ("resume_corrupted_checkpoint", ["--method", "fedavg", *TINY, "--checkpoint-every", "1", "--out", "{corrupted}",
                                     "--resume", "--rounds", "3"], "truncated or corrupted"),
    ("resume_finished_run", ["--method", "fedavg", *TINY, "--checkpoint-every", "1", "--out", "{finished}",
                             "--resume"], "already finished its 2 rounds"),
    ("resume_other_method", ["--method", "fedprox", *TINY, "--checkpoint-every", "1", "--out", "{finished}",
                             "--resume"], "method_name: 'fedavg' -> 'fedprox'"),
    ("resume_other_lr", ["--method", "fedavg", *TINY, "--checkpoint-every", "1", "--out", "{finished}",
                         "--resume", "--lr", "0.1"], "train.lr"),
    ("resume_fewer_rounds", ["--out", "{finished}", "--resume", "--rounds", "1"], "--rounds must be more than 2"),
    ("rerun_into_finished_folder", ["--method", "fedavg", *TINY, "--out", "{finished}"], "already holds a run"),
    ("list_of_an_untraceable_option", ["--method", "fedavg", *TINY, "method.finetune_epochs=[1,2]"],
     "cannot be a list"),
    ("list_of_non_numbers", ["--method", "fedprox", *TINY, "method.mu=[a,b]"], "list of numbers"),
    ("seeds_not_numbers", ["--method", "fedavg", *TINY, "--seeds", "a,b"], "--seeds"),
    ("seeds_repeated", ["--method", "fedavg", *TINY, "--seeds", "1,1"], "distinct"),
    ("resume_a_sweep", ["--out", "{finished}", "--resume", "--rounds", "3", "--seeds", "0,1"], "resume a point"),
    ("lr_decay_above_one", ["--method", "fedavg", *TINY, "train.lr_decay=1.5"], "train.lr_decay"),
    ("val_fraction_one", ["--method", "fedavg", *TINY, "partition.val_fraction=1"], "val_fraction"),
]


@pytest.mark.parametrize("argv,needle", [row[1:] for row in BAD_INPUTS], ids=[row[0] for row in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(argv, needle, tmp_path, finished_run, capsys):
    paths = _setup(tmp_path, finished_run)
    before = _tree_digest(finished_run)
    code, err = _run([a.format(**paths) for a in argv], capsys)
    _assert_one_line_error(code, err, needle)
    assert _tree_digest(finished_run) == before  # nothing already written is lost or rewritten


def test_explicit_data_dir_without_the_files_is_an_error_even_with_the_env_set(tmp_path, data_dir, capsys,
                                                                               monkeypatch):
    monkeypatch.setenv(files.ENV_DATA_DIR, str(data_dir))
    monkeypatch.setenv(files.ENV_CACHE_DIR, str(tmp_path / "cache"))
    empty = tmp_path / "empty"
    empty.mkdir()
    code, err = _run(["--method", "fedavg", "--dataset", "mnist", "--model", "mlr", "--no-progress",
                      "--data-dir", str(empty), "--out", str(tmp_path / "r")], capsys)
    _assert_one_line_error(code, err, f"--data-dir {empty} lacks the dataset files")
    assert not (tmp_path / "r").exists() and not (tmp_path / "cache").exists()


def test_missing_cifar10_names_folders_and_the_alternatives(tmp_path, capsys, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(files.ENV_DATA_DIR, str(empty))
    monkeypatch.setenv(files.ENV_CACHE_DIR, str(tmp_path / "cache"))
    code, err = _run(["--method", "fedavg", "--offline", "--no-progress", "--out", str(tmp_path / "r")], capsys)
    _assert_one_line_error(code, err, "cifar-10-python.tar.gz")
    for text in (str(empty / "cifar10"), str(tmp_path / "cache"), f"{files.ENV_DATA_DIR}={empty}",
                 "--dataset cifar10_jpeg", "--dataset synthetic"):
        assert text in err, text
    assert f"set {files.ENV_DATA_DIR}=DIR" not in err  # it is already set


def test_failed_download_leaves_no_empty_cache_folders(tmp_path, monkeypatch):
    monkeypatch.setenv(files.ENV_CACHE_DIR, str(tmp_path / "cache" / "deeper"))
    monkeypatch.delenv(files.ENV_DATA_DIR, raising=False)
    spec = files.DataFile("absent.bin", "0" * 32)
    with pytest.raises(UserError, match="Could not download"):
        files.find_file(spec, "fakeset", allow_download=True, base_url="http://127.0.0.1:9/", progress=False)
    assert not (tmp_path / "cache").exists()


def test_a_real_process_prints_one_line_and_exits_2(tmp_path):
    """The exit code and stderr of `python -m fedjax_pfl.train` itself (no traceback)."""
    (tmp_path / "bad.yaml").write_text("a: [\n")
    proc = subprocess.run([sys.executable, "-m", "fedjax_pfl.train", "--config", str(tmp_path / "bad.yaml")],
                          capture_output=True, text=True, timeout=120)
    _assert_one_line_error(proc.returncode, proc.stderr, "not valid YAML")
