"""Bad input on the command line: every case exits 2 with ONE line on stderr, no traceback,
and leaves what an earlier run wrote untouched. Add a row to BAD_INPUTS for each new check of the
training command, and to EVERY_COMMAND for a kind of input that train, reproduce and report share.
An internal error (a bug) exits 1 with one line naming error.log, which holds the traceback."""

import hashlib
import shutil
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedjax_pfl.runs import cli as train
from fedjax_pfl.runs import report
from fedjax_pfl.papers import reproduce
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
    ("unknown_augment", ["--method", "fedavg", *TINY, "train.augment=rotate"], "train.augment must be one of"),
    ("augment_features", ["--method", "fedavg", *TINY, "train.augment=crop_flip"], "feature vectors"),
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
    ("unknown_precision", ["--method", "fedavg", *TINY, "train.precision=fp16"], "train.precision must be one of"),
    ("unknown_conv_impl", ["--method", "fedavg", *TINY, "model.conv_impl=winograd"], "model.conv_impl must be one of"),
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


def test_the_headline_command_without_data_or_network_says_what_to_do(tmp_path, capsys, monkeypatch):
    """``python -m fedjax_pfl.train --method fedas`` (download allowed) on a machine without the files and
    without network: one line naming the folders searched and the failed download, and the alternatives."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(files.ENV_DATA_DIR, str(empty))
    monkeypatch.setenv(files.ENV_CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.setenv(files.ENV_BASE_URL, "http://127.0.0.1:9/")  # nothing listens there: the download fails
    code, err = _run(["--method", "fedas", "--no-progress", "--out", str(tmp_path / "r")], capsys)
    _assert_one_line_error(code, err, "cifar-10-python.tar.gz")
    for text in (str(empty / "cifar10"), "downloading it from http://127.0.0.1:9/cifar-10-python.tar.gz failed",
                 "--dataset synthetic", "--dataset cifar10_jpeg"):
        assert text in err, text
    assert not (tmp_path / "r").exists()


def test_failed_download_leaves_no_empty_cache_folders(tmp_path, monkeypatch):
    monkeypatch.setenv(files.ENV_CACHE_DIR, str(tmp_path / "cache" / "deeper"))
    monkeypatch.delenv(files.ENV_DATA_DIR, raising=False)
    spec = files.DataFile("absent.bin", "0" * 32)
    with pytest.raises(UserError, match="downloading it from .* failed"):
        files.find_file(spec, "fakeset", allow_download=True, base_url="http://127.0.0.1:9/", progress=False)
    assert not (tmp_path / "cache").exists()


def test_a_real_process_prints_one_line_and_exits_2(tmp_path):
    """The exit code and stderr of `python -m fedjax_pfl.train` itself (no traceback)."""
    (tmp_path / "bad.yaml").write_text("a: [\n")
    proc = subprocess.run([sys.executable, "-m", "fedjax_pfl.train", "--config", str(tmp_path / "bad.yaml")],
                          capture_output=True, text=True, timeout=120)
    _assert_one_line_error(proc.returncode, proc.stderr, "not valid YAML")


def test_a_real_process_resuming_a_damaged_checkpoint_prints_one_line(tmp_path, finished_run):
    """Orbax left reads of a damaged checkpoint running after the error, and about every second process
    printed their 'Event loop is closed' traceback after the one-line error; the digests refuse the files
    before Orbax reads them."""
    for attempt in range(3):
        (tmp_path / str(attempt)).mkdir()
        paths = _setup(tmp_path / str(attempt), finished_run)
        proc = subprocess.run([sys.executable, "-m", "fedjax_pfl.train", "--out", str(paths["corrupted"]),
                               "--resume", "--rounds", "3", "--no-progress"], capture_output=True, text=True,
                              timeout=120)
        _assert_one_line_error(proc.returncode, proc.stderr, "truncated or corrupted")


# ------------------------------------------------------------ the same table for every command

TABLE = """
paper: "Tiny paper"
table: "Table 0"
metric: last
seeds: [0]
settings:
  - name: synth
    overrides: [data.name=synthetic, partition.scheme=natural, partition.num_clients=3, model.name=mlr,
                train.rounds=2, train.local_epochs=1]
methods: [fedavg]
"""
TRAIN = ["--method", "fedavg", *TINY]
REPRODUCE = ["--table-file", "{tmp}/table.yaml", "--no-progress"]
REPORT = ["{finished}"]
COMMAND_MAINS = {"train": train.main, "reproduce": reproduce.main, "report": report.main}

EVERY_COMMAND = [  # (case, {command: argv}, needle or {command: needle}); a command without the input is left out
    ("out_not_writable", {"train": [*TRAIN, "--out", "/proc/fedjax_pfl_x"],
                          "reproduce": [*REPRODUCE, "--out", "/proc/fedjax_pfl_x"],
                          "report": [*REPORT, "--out", "/proc/fedjax_pfl_x"]}, "cannot write in /proc"),
    ("out_is_a_file", {"train": [*TRAIN, "--out", "{tmp}/a_file"], "reproduce": [*REPRODUCE, "--out", "{tmp}/a_file"],
                       "report": [*REPORT, "--out", "{tmp}/a_file"]}, "is a file"),
    ("out_under_a_file", {"train": [*TRAIN, "--out", "{tmp}/a_file/x"],
                          "reproduce": [*REPRODUCE, "--out", "{tmp}/a_file/x"],
                          "report": [*REPORT, "--out", "{tmp}/a_file/x"]}, "which is a file"),
    ("unknown_flag", {"train": [*TRAIN, "--nosuch", "3"], "reproduce": [*REPRODUCE, "--nosuch", "3"],
                      "report": [*REPORT, "--nosuch", "3"]}, "unrecognized arguments: --nosuch"),
    ("no_input_named", {"reproduce": [], "report": []}, {"reproduce": "name a table", "report": "RUN_DIR"}),
    ("input_missing", {"train": [*TRAIN, "--config", "{tmp}/nosuch.yaml"],
                       "reproduce": ["--table-file", "{tmp}/nosuch.yaml"], "report": ["{tmp}/nosuch"]},
     {"train": "not found", "reproduce": "not found", "report": "no such folder"}),
    ("input_not_yaml", {"train": [*TRAIN, "--config", "{tmp}/bad.yaml"],
                        "reproduce": ["--table-file", "{tmp}/bad.yaml"]}, "not valid YAML"),
    ("flag_needs_a_number", {"train": [*TRAIN, "--rounds", "many"], "reproduce": [*REPRODUCE, "--rounds", "many"]},
     "invalid int value: 'many'"),
    ("number_too_large_for_jax", {"train": [*TRAIN, "--rounds", "99999999999999"],
                                  "reproduce": [*REPRODUCE, "--rounds", "99999999999999"]}, "2147483647"),
    ("no_rounds", {"train": [*TRAIN, "--rounds", "0"], "reproduce": [*REPRODUCE, "--rounds", "0"]}, "rounds"),
    ("option_too_large_for_jax", {"train": [*TRAIN, "method.finetune_epochs=99999999999"],
                                  "reproduce": [*REPRODUCE, "method.finetune_epochs=99999999999"]},
     "method.finetune_epochs must be finite and at most 2147483647"),
    ("float_too_large_for_jax", {"train": [*TRAIN, "--lr", "1e39"], "reproduce": [*REPRODUCE, "train.lr=1e39"]},
     "train.lr must be finite and at most 3.403e+38"),
    ("seeds_with_an_empty_item", {"train": [*TRAIN, "--seeds", "0,,1"], "reproduce": [*REPRODUCE, "--seeds", "0,,1"]},
     "--seeds takes comma-separated whole numbers"),
    ("seeds_negative", {"train": [*TRAIN, "--seeds=0,-1"], "reproduce": [*REPRODUCE, "--seeds=0,-1"]}, ">= 0"),
    ("negative_rounds_per_call", {"train": [*TRAIN, "--rounds-per-call", "-1"],
                                  "reproduce": [*REPRODUCE, "train.rounds_per_call=-1"]}, "train.rounds_per_call"),
    ("unknown_config_key", {"train": [*TRAIN, "train.nosuch=1"], "reproduce": [*REPRODUCE, "train.nosuch=1"]},
     "unknown config key 'train.nosuch'"),
    ("data_dir_missing", {"train": [*TRAIN[:-1], "--dataset", "mnist", "--data-dir", "{tmp}/nonexistent"],
                          "reproduce": [*REPRODUCE, "data.name=mnist", "--data-dir", "{tmp}/nonexistent"]},
     "is not a folder"),
]
EVERY_COMMAND_CASES = [(case, command, argv, needle if isinstance(needle, str) else needle[command])
                       for case, argvs, needle in EVERY_COMMAND for command, argv in argvs.items()]


@pytest.mark.parametrize("case,command,argv,needle", EVERY_COMMAND_CASES,
                         ids=[f"{case}-{command}" for case, command, *_ in EVERY_COMMAND_CASES])
def test_every_command_gives_bad_input_one_line_and_exit_2(case, command, argv, needle, tmp_path, finished_run,
                                                          capsys):
    paths = _setup(tmp_path, finished_run)
    (tmp_path / "table.yaml").write_text(TABLE)
    before, files_before = _tree_digest(finished_run), sorted(p.name for p in tmp_path.iterdir())
    code = COMMAND_MAINS[command]([a.format(**paths) for a in argv])
    _assert_one_line_error(code, capsys.readouterr().err, needle)
    assert _tree_digest(finished_run) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == files_before  # no output folder, no error.log


@pytest.mark.parametrize("command", ["train", "reproduce", "report"])
def test_a_real_process_of_every_command_prints_one_line_and_exits_2(command, tmp_path):
    """The exit code and stderr of ``python -m fedjax_pfl.<command>`` itself (no traceback)."""
    proc = subprocess.run([sys.executable, "-m", f"fedjax_pfl.{command}", "--out", "/proc/fedjax_pfl_x",
                           *{"train": TRAIN, "reproduce": ["pfedkd_table1"], "report": [str(tmp_path)]}[command]],
                          capture_output=True, text=True, timeout=120)
    _assert_one_line_error(proc.returncode, proc.stderr, "cannot write in /proc")


# ------------------------------------------------------------ internal errors


def _crash(*args, **kwargs):
    raise RuntimeError("a planted bug")


def _assert_internal_error(code, err, log: Path):
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: internal error (RuntimeError: a planted bug)"), err
    assert str(log) in lines[0] and "Traceback" not in err
    assert "Traceback" in log.read_text() and "a planted bug" in log.read_text()


def test_a_crash_mid_run_is_status_failed_exit_1_and_error_log(tmp_path, capsys, monkeypatch):
    from fedjax_pfl.runs import single_run

    out = tmp_path / "run"
    monkeypatch.setattr(single_run.SingleProgram, "evaluate", _crash)  # called at the checkpoint after round 1
    code = train.main([*TRAIN, "--checkpoint-every", "1", "--eval-every", "2", "--out", str(out)])
    _assert_internal_error(code, capsys.readouterr().err, out / "error.log")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == "RuntimeError: a planted bug"
    assert checkpoint.exists(checkpoint.checkpoint_path(out))  # what was written before the crash stays


def test_a_crash_in_a_reproduced_cell_is_one_line_and_its_error_log(tmp_path, capsys, monkeypatch):
    from fedjax_pfl.runs import single_run

    (tmp_path / "table.yaml").write_text(TABLE)
    monkeypatch.setattr(single_run.SingleProgram, "call", _crash)
    out = tmp_path / "repro"
    code = reproduce.main([a.format(tmp=tmp_path) for a in REPRODUCE] + ["--out", str(out)])
    err = capsys.readouterr().err
    cell = out / "runs" / "fedavg-synth" / "seed0"
    assert code == 1 and "Traceback" not in err
    assert f"error: internal error (RuntimeError: a planted bug); the traceback is in {cell / 'error.log'}" in err
    assert json.loads((cell / "summary.json").read_text())["status"] == "failed"
    assert "1 failed" in (out / "table.md").read_text()


def test_a_crash_in_the_report_is_one_line_exit_1(tmp_path, finished_run, capsys, monkeypatch):
    monkeypatch.setattr(report, "markdown", _crash)
    code = report.main([str(finished_run), "--out", str(tmp_path / "rep")])
    _assert_internal_error(code, capsys.readouterr().err, tmp_path / "rep" / "error.log")
