"""Bad input on the command line: every case exits 2 with ONE line on stderr, no traceback,
and leaves what an earlier run wrote untouched. The cases, with their exact messages, are the one
list in tests/bad_input_cases.py (the reliability page's table is built from it): add a case there
for each new check of a command. An internal error (a bug) exits 1 with one line naming error.log,
which holds the traceback."""

import hashlib
import shutil
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedjax_pfl.commands import train
from fedjax_pfl.commands import report
from fedjax_pfl.outputs import report as report_files
from fedjax_pfl.cells import reproduce
from fedjax_pfl.engine import checkpoint
from fedjax_pfl.data import files
from fedjax_pfl.core.errors import UserError
from bad_input_cases import CASES_LIST, REPORT, REPRODUCE, TINY, TRAIN, assert_case



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
    (tmp_path / "twice.yaml").write_text("train:\n  rounds: 2\n  lr: 0.1\ntrain:\n  rounds: 40\n")
    runs = {}
    for name, damage in (("truncated", lambda b: b[: len(b) // 2]), ("corrupted", lambda b: b"\0" * 64 + b[64:])):
        copy = tmp_path / name
        shutil.copytree(finished_run, copy)
        for data in _array_files(checkpoint.checkpoint_path(copy)):
            data.write_bytes(damage(data.read_bytes()))
        runs[name] = copy
    for name, damage in DAMAGE.items():
        runs[name] = tmp_path / name
        shutil.copytree(finished_run, runs[name])
        damage(runs[name])
    return {"tmp": tmp_path, "empty": empty, "finished": finished_run, **runs}


def _scatter(run: Path) -> None:
    """Bytes flipped here and there in every file of the checkpoint, its digests left as saved."""
    for i, file in enumerate(sorted(p for p in checkpoint.checkpoint_path(run).rglob("*")
                                    if p.is_file() and p.name != checkpoint.MANIFEST)):
        data = bytearray(file.read_bytes())
        for at in range(i % 7, len(data), 97):
            data[at] ^= 0x5A
        file.write_bytes(bytes(data))


DAMAGE = {  # copies of the finished run, each damaged so
    "no_metrics": lambda run: (run / "metrics.jsonl").unlink(),
    "no_digests": lambda run: next(checkpoint.checkpoint_path(run).glob(f"*/{checkpoint.MANIFEST}")).unlink(),
    "emptied_checkpoint": lambda run: [p.unlink() for p in checkpoint.checkpoint_path(run).rglob("*") if p.is_file()],
    "scattered": _scatter,
    "bad_summary": lambda run: (run / "summary.json").write_text('{"status": "fini'),
}


ARGV_CASES = [case for case in CASES_LIST if case.argv is not None]


@pytest.mark.parametrize("case", ARGV_CASES, ids=[case.name for case in ARGV_CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, tmp_path, finished_run, capsys):
    """Each command-line case of tests/bad_input_cases.py: its exit status and exactly its one line; nothing
    already written is lost or rewritten, and no output folder or error.log is left."""
    paths = _setup(tmp_path, finished_run)
    (tmp_path / "table.yaml").write_text(TABLE)
    before, files_before = _tree_digest(finished_run), sorted(p.name for p in tmp_path.iterdir())
    code = COMMAND_MAINS[case.command]([a.format(**paths) for a in case.argv])
    assert_case(case.name, code, capsys.readouterr().err, tmp=tmp_path, finished=finished_run)
    assert _tree_digest(finished_run) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == files_before


def test_every_case_without_a_command_line_names_a_test_that_exists():
    """The cases a test sets the scene for (tests/bad_input_cases.py's checked_by) are each checked by a test."""
    sources = "".join(path.read_text() for path in Path(__file__).parent.glob("test_*.py"))
    for case in CASES_LIST:
        if case.argv is None:
            assert case.checked_by and f"def {case.checked_by}(" in sources, case.name
            assert f'assert_case("{case.name}"' in sources or f"(\"{case.name}\"" in sources, case.name


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


def test_a_data_dir_without_the_files_says_how_to_get_them(tmp_path, capsys, monkeypatch):
    """--data-dir given: the message says the command downloads only with --download and without --data-dir, and
    names no flag the command does not have."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(files.ENV_DATA_DIR, str(empty))
    monkeypatch.setenv(files.ENV_CACHE_DIR, str(tmp_path / "cache"))
    code, err = _run(["--method", "fedavg", "--dataset", "mnist", "--model", "mlr", "--no-progress",
                      "--data-dir", str(empty), "--out", str(tmp_path / "r")], capsys)
    assert_case("data_dir_without_the_file", code, err, tmp=tmp_path)
    assert "--offline" not in err.split("(allow_download=True;")[1].split(")")[0]
    assert not (tmp_path / "r").exists()


def _flip_a_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_bit_flipped_gzip_is_one_line_exit_2_and_no_folder(tmp_path, data_dir, capsys):
    """A flipped byte inside a gzip's compressed data (zlib: 'invalid distance too far back'): the checksum line
    naming the file and the fix, exit 2, and no run folder, not even one holding error.log."""
    copy = tmp_path / "mnist"
    shutil.copytree(data_dir / "mnist", copy)
    _flip_a_byte(copy / "train-labels-idx1-ubyte.gz", 1000)
    out = tmp_path / "run"
    code, err = _run(["--method", "fedavg", "--dataset", "mnist", "--model", "mlr", "--no-progress",
                      "--data-dir", str(tmp_path), "--out", str(out)], capsys)
    assert_case("bit_flipped_gzip", code, err, tmp=tmp_path)
    assert not out.exists()


def test_missing_cifar10_names_folders_and_the_alternatives(tmp_path, capsys, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(files.ENV_DATA_DIR, str(empty))
    monkeypatch.setenv(files.ENV_CACHE_DIR, str(tmp_path / "cache"))
    code, err = _run(["--method", "fedavg", "--no-progress", "--out", str(tmp_path / "r")], capsys)
    _assert_one_line_error(code, err, "cifar-10-python.tar.gz")
    for text in (str(empty / "cifar10"), str(tmp_path / "cache"), f"{files.ENV_DATA_DIR}={empty}",
                 "--dataset cifar10_jpeg", "--dataset synthetic"):
        assert text in err, text
    assert f"set {files.ENV_DATA_DIR}=DIR" not in err  # it is already set


def test_the_headline_command_without_data_or_network_says_what_to_do(tmp_path, capsys, monkeypatch):
    """``python -m fedjax_pfl.train --method fedas --download`` on a machine without the files and
    without network: one line naming the folders searched and the failed download, and the alternatives."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(files.ENV_DATA_DIR, str(empty))
    monkeypatch.setenv(files.ENV_CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.setenv(files.ENV_BASE_URL, "http://127.0.0.1:9/")  # nothing listens there: the download fails
    code, err = _run(["--method", "fedas", "--download", "--no-progress", "--out", str(tmp_path / "r")], capsys)
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


# ------------------------------------------------------------ every command

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
COMMAND_MAINS = {"train": train.main, "reproduce": reproduce.main, "report": report.main}


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
    monkeypatch.setattr(report_files, "markdown", _crash)
    code = report.main([str(finished_run), "--out", str(tmp_path / "rep")])
    _assert_internal_error(code, capsys.readouterr().err, tmp_path / "rep" / "error.log")
