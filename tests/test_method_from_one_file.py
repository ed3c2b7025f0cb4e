"""A new method is one file: a toy method written to a folder outside the package joins the registry through
$FEDJAX_PFL_METHODS (fedjax_pfl/methods/__init__.py) and runs through the training command (a round),
``--method toy --help`` and the documentation build, with no file of the checkout touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fedjax_pfl.methods import ENV, get_method, method_names

ROOT = Path(__file__).resolve().parent.parent

TOY = '''"""Toy (a test's method): every selected client trains the global model E epochs; the server moves the
global model a step ``server_step`` toward the plain mean of the arrived uploads.

Evaluation (``eval.model``): ``global``, the global model.
"""

import dataclasses

import jax.numpy as jnp

from fedjax_pfl import aggregation
from fedjax_pfl.core import tree_ops
from fedjax_pfl.methods import training
from fedjax_pfl.methods.base import Algorithm, Paper
from fedjax_pfl.methods.options import Options, option


@dataclasses.dataclass(frozen=True)
class ToyOptions(Options):
    server_step: float = option(1.0, "step of the global model toward the uploads' mean", more_than=0.0,
                                at_most=1.0)


def init(m, key, num_clients):
    return {"variables": m.model.init(key)}, {}


def client_update(m, server, client, data, key, info):
    variables, loss = training.train(m.local, training.supervised_objective(m), server["variables"], data, key,
                                     info.epochs)
    return client, {"variables": variables, "loss": loss}


def server_update(m, server, clients, uploads, info):
    mean = aggregation.weighted_mean_or(uploads["variables"], info.uploaded.astype(jnp.float32),
                                        server["variables"])
    return {"variables": tree_ops.interpolate(mean, server["variables"], m.hparams.server_step)}, clients


def eval_variables(m, server, client, data, key):
    return server["variables"]


TOY = Algorithm(
    name="toy",
    paper=Paper("Toy", note="A method a test writes to show that one file makes a method."),
    hparams_type=ToyOptions,
    eval_models=("global",),
    init=init,
    client_update=client_update,
    server_update=server_update,
    eval_variables=eval_variables,
)
'''

TINY = ["--dataset", "synthetic", "--model", "mlp", "model.hidden=[16]", "--num-clients", "6", "--partition",
        "natural", "--local-epochs", "1", "--lr", "0.05", "--no-progress"]


def _checkout_state() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout


def _run(args, env, cwd=ROOT):
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_a_method_in_one_file_trains_documents_and_explains_itself(tmp_path, monkeypatch):
    folder = tmp_path / "my_methods"
    folder.mkdir()
    (folder / "toy.py").write_text(TOY, encoding="utf-8")
    before = _checkout_state()

    assert "toy" not in method_names()  # the package alone does not have it
    monkeypatch.setenv(ENV, str(folder))
    assert "toy" in method_names() and get_method("toy").paper.name == "Toy"
    env = {**os.environ, ENV: str(folder)}

    help_run = _run(["-m", "fedjax_pfl.train", "--method", "toy", "--help"], env)
    assert help_run.returncode == 0, help_run.stderr
    assert "method toy: Toy (a test's method)" in help_run.stdout
    assert "server_step" in help_run.stdout and "step of the global model toward the uploads' mean" in help_run.stdout

    out = tmp_path / "run"
    train_run = _run(["-m", "fedjax_pfl.train", "--method", "toy", *TINY, "--rounds", "1", "--out", str(out),
                      "method.server_step=0.5"], env)
    assert train_run.returncode == 0, train_run.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["last"]["round"] == 1 and "accuracy" in summary["last"]
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["method_name"] == "toy" and config["method"] == {"server_step": 0.5}

    site = tmp_path / "site"
    docs_run = _run(["-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)], env)
    assert docs_run.returncode == 0, f"{docs_run.stdout}\n{docs_run.stderr}"
    page = (site / "methods" / "toy.html").read_text(encoding="utf-8")
    assert "A method a test writes" in page and "method.server_step" in page
    assert "toy.html" in (site / "methods" / "index.html").read_text(encoding="utf-8")

    assert _checkout_state() == before, "adding the method changed a file of the checkout"
