"""fedjax_pfl against pfl-research (PyPI ``pfl``, the ``peers`` extra) on pfl-research's own CIFAR-10 benchmark.

The workload is pfl-research's CIFAR-10 cross-device benchmark as its
configuration states it (its image-classification ``baseline.yaml``: dataset
``cifar10_iid``, model ``simple_cnn``, algorithm ``fedavg``), `PFL_CONFIG`:

- CIFAR-10's 50,000 training images, each channel normalised by the
  training set's own mean and std, in a random permutation cut into 1,000
  clients of 50 images (iid);
- 50 clients a round; each trains 1 local epoch of plain SGD, learning rate
  0.1, batches of 10 (5 steps);
- the server moves the model by the mean of the clients' model differences
  with equal weights (``weight_by_samples: false``; central SGD at learning
  rate 1.0): FedAvg's mean of the clients' models;
- the central evaluation of the model on the 10,000 test images before
  training and every 10 rounds (pfl-research: one batch of 10,000);
- the model, ``simple_cnn``: conv 3x3 32 VALID, ReLU, conv 3x3 64 VALID,
  ReLU, 2x2 max-pool, dropout 0.25, flatten, Dense 128, ReLU, dropout 0.5,
  Dense 10, cross-entropy; fedjax_pfl's twin is ``pfl_cnn``
  (models/networks.py), the same layers without the dropout: no fedjax_pfl
  model has dropout. pfl-research trains 1,500 rounds; here ``--blocks``
  timed blocks of 10 rounds.

Both sides get the same arrays: the project's CIFAR-10 copy
(``$FEDJAX_PFL_DATA_DIR/cifar10_jpeg``) loaded through ``fedjax_pfl.data``, the
clients cut by ``fedjax_pfl.data.partition.iid``, and both start from the same
initial parameters (`initial_parameters`: pfl-research's Glorot-uniform weights,
PyTorch's default biases, drawn once in NumPy). Each side runs in its own
process and they take turns: block 0 (the evaluation before training,
rounds 0-10, an evaluation: compile and warm-up) and then each block of 10
rounds and its evaluation run on one side while the other waits, sides
alternating. pfl-research is built with its public API (``FederatedDataset``,
``PyTorchModel``, ``SimulatedBackend``, ``FederatedAveraging``,
``CentralEvaluationCallback``; one process, its default without a launcher);
fedjax_pfl with its engine (``Engine.round``, ``Engine.evaluate``: each client
evaluated on 10 of the test images, so all 10,000 are seen once), the client
mapping its timed ``auto`` choice (cost reported apart) and, on a CPU, the
training command's host devices (``devices.cpu=auto``).

One JSON line per side and a comparison line: seconds per round end to end
(a block's rounds and its evaluation, over the rounds) and for training
alone, seconds per evaluation (medians over the timed blocks), the accuracy
on the 10,000 test images after each block (so nobody wins by learning less)
and the ratios pfl-research / fedjax_pfl. Without ``pfl`` (and torch) the
peer's row says why in one line and fedjax_pfl runs alone.

BlazeFL (PyPI ``blazefl``) is not compared: its release 3.0.0 requires Python
3.14 (benchmarks/RESULTS.md).

    python benchmarks/vs_pfl.py --quick              # block 0, then 2 timed blocks of 10 rounds per side
    python benchmarks/vs_pfl.py --blocks 10          # 10 timed blocks (111 rounds per side)
    python benchmarks/vs_pfl.py --quick --device gpu # pfl-research on torch CUDA against fedjax_pfl on the GPU
    python benchmarks/vs_pfl.py --tiny               # tests: pfl-research's counts on random CIFAR-shaped data,
                                                     # 1,000 test images, an evaluation every round, 1 timed block
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

# pfl-research's benchmark configuration (benchmarks/image_classification/configs/baseline.yaml)
PFL_CONFIG = {"dataset": "cifar10_iid", "model": "simple_cnn", "algorithm": "fedavg", "clients": 1000,
              "images_per_client": 50, "cohort": 50, "local_epochs": 1, "local_lr": 0.1, "batch": 10,
              "central_lr": 1.0, "weight_by_samples": False, "eval_every": 10, "eval_batch": 10000,
              "central_rounds": 1500}
MARK = "@@vs_pfl "  # a child's protocol lines on stdout start with this
SIDES = ("pfl", "fedjax_pfl")


# ------------------------------------------------------------------------------------ the shared workload --


def workload_arrays(spec: dict):
    """(Dataset with uint8 images and the train set's channel statistics, client index lists, test images as
    (x uint8, y)): the same for both sides."""
    from fedjax_pfl.data import partition
    from fedjax_pfl.data.dataset import channel_stats

    if spec["data"] == "random":  # CIFAR-10's shapes, no files (tests)
        from common import random_cifar_like

        dataset = random_cifar_like(spec["clients"] * spec["images_per_client"], spec["test_images"])
    else:
        from fedjax_pfl.data.registry import load_dataset

        dataset = load_dataset("cifar10_jpeg", data_dir=spec.get("data_dir"))
    mean, std = channel_stats(dataset.x_train)  # the train set's own statistics, as pfl-research's loader
    dataset = dataclasses.replace(dataset, mean=mean, std=std)
    clients = partition.iid(dataset.y_train, spec["clients"], spec["seed"])
    test = np.arange(min(spec["test_images"], len(dataset.y_test)))
    return dataset, clients, test


def initial_parameters(seed: int, image_shape=(32, 32, 3), classes: int = 10) -> dict:
    """simple_cnn's initial parameters in PyTorch's layout (OIHW kernels, [out, in] weights): pfl-research's
    Glorot (Xavier) uniform weights and PyTorch's default biases, U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    rng = np.random.default_rng(seed)
    h, w, c = image_shape
    side = (h - 4) // 2
    shapes = {"conv0": (32, c, 3, 3), "conv1": (64, 32, 3, 3), "dense0": (128, side * side * 64),
              "logits": (classes, 128)}
    out = {}
    for name, shape in shapes.items():
        fan_in = int(np.prod(shape[1:]))
        fan_out = shape[0] * int(np.prod(shape[2:]))
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        out[f"{name}.weight"] = rng.uniform(-bound, bound, shape).astype(np.float32)
        out[f"{name}.bias"] = rng.uniform(-1, 1, shape[0]).astype(np.float32) / np.float32(np.sqrt(fan_in))
    return out


def as_flax_params(torch_params: dict, image_shape=(32, 32, 3)) -> dict:
    """`initial_parameters` as fedjax_pfl's ``pfl_cnn`` parameter tree (HWIO kernels, [in, out] weights; the first
    Dense layer's rows reordered from PyTorch's (C, H, W) flattening to (H, W, C))."""
    side = (image_shape[0] - 4) // 2
    p = torch_params
    dense0 = p["dense0.weight"].reshape(128, 64, side, side).transpose(2, 3, 1, 0).reshape(side * side * 64, 128)
    return {
        "body": {"conv0": {"kernel": p["conv0.weight"].transpose(2, 3, 1, 0), "bias": p["conv0.bias"]},
                 "conv1": {"kernel": p["conv1.weight"].transpose(2, 3, 1, 0), "bias": p["conv1.bias"]},
                 "mlp": {"dense0": {"kernel": np.ascontiguousarray(dense0), "bias": p["dense0.bias"]}}},
        "head": {"logits": {"kernel": np.ascontiguousarray(p["logits.weight"].T), "bias": p["logits.bias"]}},
    }


def block_rounds(block: int, eval_every: int) -> range:
    """The rounds of a block: block 0 is rounds 0..eval_every (pfl-research evaluates after round index
    ``eval_every``, not after round 0), block b > 0 the next ``eval_every``."""
    if block == 0:
        return range(0, eval_every + 1)
    return range(eval_every * block + 1, eval_every * (block + 1) + 1)


def peak_memory_bytes(device: str) -> int:
    import resource

    if device == "gpu":
        return -1  # each side fills in its accelerator's own figure
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ------------------------------------------------------------------------------------ fedjax_pfl's side --


def fedjax_blocks(spec: dict):
    """Yields the setup record, then one record per block: fedjax_pfl's engine on the workload."""
    from fedjax_pfl.runs import host_devices

    devices = host_devices.apply(spec["cpu_devices"]) if spec["device"] == "cpu" else {"why": "gpu"}
    import jax

    from common import run_config
    from fedjax_pfl.data.client_data import stack_clients
    from fedjax_pfl.engine import mapping_choice
    from fedjax_pfl.engine.engine import Engine, clients_per_round, round_keys, summarize_evaluation
    from fedjax_pfl.methods import get_method
    from fedjax_pfl.runs import config as config_lib
    from fedjax_pfl.runs.experiment import build_setup, engine_config

    if spec["device"] == "gpu" and jax.default_backend() != "gpu":
        raise SystemExit(f"vs_pfl: --device gpu, but JAX's backend is {jax.default_backend()}")
    dataset, clients, test = workload_arrays(spec)
    cfg = run_config(**{"method_name": "fedavg", "model.name": "pfl_cnn", "train.batch_size": spec["batch"],
                        "train.local_epochs": spec["local_epochs"], "train.lr": spec["local_lr"]})
    method_cls = get_method("fedavg")
    method = method_cls(build_setup(cfg, dataset), config_lib.method_options(method_cls.hparams_type, {}))
    train = stack_clients(dataset.x_train, dataset.y_train, clients)
    # the test images dealt 10 to a client (one evaluation batch each): every image evaluated once
    test_data = stack_clients(dataset.x_test, dataset.y_test, np.array_split(test, spec["clients"]))
    # (the engine sizes evaluation batches to the test sets: one batch of 10 a client, as pfl-research's)
    engine = Engine(method, train, test_data,
                    engine_config(cfg.train, clients_per_round(spec["clients"], spec["cohort"] / spec["clients"])))
    key = jax.random.key(spec["seed"])
    server, client_states = engine.init(key)
    params = as_flax_params(initial_parameters(spec["seed"]))
    server["variables"]["params"] = jax.tree.map(lambda a, b: jax.device_put(np.asarray(b, a.dtype), a.sharding),
                                                 server["variables"]["params"], params)
    engine, choice = mapping_choice.choose_or_default(engine, spec["mapping"], spec["central_rounds"], server,
                                                      client_states, round_keys(key, 0)[0], 0)
    yield {"jax": jax.__version__, "backend": jax.default_backend(), "devices": jax.device_count(),
           "devices_why": devices["why"], "client_mapping": engine.mapping, "mapping_choice": choice,
           "mapping_choice_s": choice.get("seconds", 0.0), "clients_per_round": engine.config.clients_per_round,
           "train_images_per_client": sorted(set(np.asarray(train.n).tolist())),
           "test_images": int(np.asarray(test_data.n).sum())}

    def evaluate(t):
        start = time.perf_counter()
        out = engine.evaluate(server, client_states, round_keys(key, t)[1])
        return time.perf_counter() - start, summarize_evaluation(out)["accuracy_weighted"]

    for block in range(spec["blocks"] + 1):
        eval_s = evaluate(0)[0] if block == 0 else 0.0  # pfl-research evaluates before training too
        train_s, real = [], 0
        for t in block_rounds(block, spec["eval_every"]):
            start = time.perf_counter()
            server, client_states, metrics = engine.round(server, client_states, round_keys(key, t)[0], t)
            jax.block_until_ready((server, client_states, metrics))
            train_s.append(time.perf_counter() - start)
            real += int(metrics["real_steps"])
        seconds, accuracy = evaluate(t)
        yield {"block": block, "rounds": [block_rounds(block, spec["eval_every"])[0], t + 1], "train_s": train_s,
               "eval_s": eval_s + seconds, "accuracy": accuracy, "client_steps": real}
    yield {"peak_memory_bytes": _jax_peak_memory(spec["device"])}


def _jax_peak_memory(device: str) -> int:
    import jax

    stats = jax.devices()[0].memory_stats() if device == "gpu" else None
    return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else peak_memory_bytes("cpu")


# -------------------------------------------------------------------------------------- pfl-research's side --


def peer_missing() -> str | None:
    """None when pfl-research and torch import, else one line on how to get them."""
    try:
        import pfl  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        return (f"pfl-research is not installed ({e.name} missing): pip install 'fedjax_pfl[peers]' "
                "(pfl 0.6.0 and a PyTorch) to time it")
    return None


def simple_cnn(image_shape=(32, 32, 3), classes: int = 10):
    """pfl-research's simple_cnn as its benchmark describes it (NHWC inputs), with the loss and metrics
    pfl's PyTorchModel asks of a model."""
    import torch
    from torch import nn

    from pfl.metrics import Weighted

    h, w, c = image_shape
    side = (h - 4) // 2

    class SimpleCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv0, self.conv1 = nn.Conv2d(c, 32, 3), nn.Conv2d(32, 64, 3)
            self.dense0, self.logits = nn.Linear(side * side * 64, 128), nn.Linear(128, classes)
            self.drop0, self.drop1 = nn.Dropout(0.25), nn.Dropout(0.5)

        def forward(self, x):
            x = torch.relu(self.conv0(x.permute(0, 3, 1, 2)))
            x = self.drop0(nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2))
            return self.logits(self.drop1(torch.relu(self.dense0(x.flatten(1)))))

        def loss(self, x, y, eval=False):  # noqa: A002 (pfl's keyword)
            self.eval() if eval else self.train()
            return nn.functional.cross_entropy(self(x), y.long())

        @torch.no_grad()
        def metrics(self, x, y, eval=True):  # noqa: A002
            self.eval() if eval else self.train()
            logits = self(x)
            return {"loss": Weighted(nn.functional.cross_entropy(logits, y.long(), reduction="sum").item(), len(x)),
                    "accuracy": Weighted((logits.argmax(-1) == y.long()).float().sum().item(), len(x))}

    return SimpleCNN()


def pfl_blocks(spec: dict, gate):
    """pfl-research on the workload; ``gate(record)`` is called with the setup record, then after each block
    with its record (it returns when the next block may start)."""
    import torch

    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByUser
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.callback.central_evaluation import CentralEvaluationCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.metrics import get_overall_value
    from pfl.model.pytorch import PyTorchModel
    from pfl.privacy import CentrallyAppliedPrivacyMechanism, NoPrivacy

    torch.set_num_threads(int(os.environ.get("TORCH_BENCH_THREADS") or os.cpu_count() or 1))
    device = torch.device("cuda" if spec["device"] == "gpu" else "cpu")
    if spec["device"] == "gpu" and not torch.cuda.is_available():
        raise SystemExit("vs_pfl: --device gpu, but torch sees no CUDA device")
    torch.manual_seed(spec["seed"])
    np.random.seed(spec["seed"])  # pfl-research's user sampler draws from NumPy's global generator
    dataset, clients, test = workload_arrays(spec)
    to_tensor = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    x_train = to_tensor(dataset.normalize(dataset.x_train).astype(np.float32))
    y_train = to_tensor(dataset.y_train.astype(np.int64))
    users = {u: [x_train[idx], y_train[idx]] for u, idx in enumerate(clients)}
    federated = FederatedDataset.from_slices(users, get_user_sampler("random", list(users)))
    central = Dataset(raw_data=[to_tensor(dataset.normalize(dataset.x_test[test]).astype(np.float32)),
                                to_tensor(dataset.y_test[test].astype(np.int64))])
    module = simple_cnn().to(device)
    module.load_state_dict({k: torch.from_numpy(v) for k, v in initial_parameters(spec["seed"]).items()})
    model = PyTorchModel(model=module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), spec["central_lr"]))
    backend = SimulatedBackend(training_data=federated, val_data=None,
                               postprocessors=[WeightByUser(), NoPrivacy(), CentrallyAppliedPrivacyMechanism(NoPrivacy())])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    eval_every = spec["eval_every"]
    state = {"block": 0, "train_s": [], "eval_s": 0.0, "start": 0.0}

    class Timer(TrainingProcessCallback):
        """First callback: a round's training ends here; the evaluation callback runs after it."""

        def on_train_begin(self, *, model):
            gate({"torch": torch.__version__, "pfl": _version("pfl"), "torch_device": str(device),
                  "torch_threads": torch.get_num_threads(), "clients_per_round": spec["cohort"]})
            state["start"] = time.perf_counter()
            return super().on_train_begin(model=model)

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            sync()
            state["mid"] = time.perf_counter()
            state["train_s"].append(state["mid"] - state["start"])
            return False, type(aggregate_metrics)()

    class Gate(TrainingProcessCallback):
        """Last callback: after the evaluation; at a block's end reports it and waits for the next turn."""

        def on_train_begin(self, *, model):  # the evaluation before training belongs to block 0
            state["eval_s"] += time.perf_counter() - state["start"]
            state["start"] = time.perf_counter()
            return super().on_train_begin(model=model)

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            sync()
            now = time.perf_counter()
            state["eval_s"] += now - state["mid"]
            rounds = block_rounds(state["block"], eval_every)
            if central_iteration == rounds[-1]:
                accuracy = next(get_overall_value(v) for k, v in aggregate_metrics if str(k) == "Central val | accuracy")
                gate({"block": state["block"], "rounds": [rounds[0], rounds[-1] + 1], "train_s": state["train_s"],
                      "eval_s": state["eval_s"], "accuracy": float(accuracy),
                      "client_steps": spec["cohort"] * spec["local_epochs"] * -(-spec["images_per_client"] //
                                                                                spec["batch"]) * len(rounds)})
                state.update(block=state["block"] + 1, train_s=[], eval_s=0.0)
            state["start"] = time.perf_counter()
            return False, type(aggregate_metrics)()

    rounds = block_rounds(spec["blocks"], eval_every)[-1] + 1
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=rounds, evaluation_frequency=eval_every,
                                           train_cohort_size=spec["cohort"], val_cohort_size=0),
        backend=backend, model=model,
        model_train_params=NNTrainHyperParams(local_learning_rate=spec["local_lr"],
                                              local_num_epochs=spec["local_epochs"], local_batch_size=spec["batch"]),
        model_eval_params=NNEvalHyperParams(local_batch_size=spec["eval_batch"]),
        callbacks=[Timer(), CentralEvaluationCallback(central, model_eval_params=NNEvalHyperParams(
            local_batch_size=spec["eval_batch"]), frequency=eval_every), Gate()])
    gate({"peak_memory_bytes": (int(torch.cuda.max_memory_allocated()) if device.type == "cuda"
                                else peak_memory_bytes("cpu"))})


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


# ------------------------------------------------------------------------------------------ orchestration --


class Child:
    """A side in its own process: it sends a record, then waits for 'go' before the next block."""

    def __init__(self, side: str, spec: dict, log_path: str):
        env = dict(os.environ)
        if spec["device"] == "cpu":
            env.update(JAX_PLATFORMS="cpu", PFL_PYTORCH_DEVICE="cpu", CUDA_VISIBLE_DEVICES="")
        else:
            env.update(PFL_PYTORCH_DEVICE="cuda", XLA_PYTHON_CLIENT_MEM_FRACTION="0.6")  # both sides share the chip
        self.side, self.log = side, open(log_path, "w")
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", side, json.dumps(spec)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)

    def next(self, go: bool = True) -> dict:
        if go:
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
        self.proc.wait()
        self.log.flush()
        with open(self.log.name) as f:
            tail = f.read()[-3000:]
        sys.stderr.write(tail)
        if self.proc.returncode == 2:
            raise SystemExit(2)
        raise SystemExit(f"vs_pfl: the {self.side} side stopped (exit {self.proc.returncode}); its log: {self.log.name}")


def child_main(side: str, spec: dict) -> int:
    from fedjax_pfl.core.errors import UserError

    def send(record):
        print(MARK + json.dumps(record), flush=True)

    def gate(record):
        send(record)
        if "peak_memory_bytes" not in record and not sys.stdin.readline():
            raise SystemExit(1)  # the parent is gone: stop, run nothing more

    try:
        if side == "fedjax_pfl":
            for record in fedjax_blocks(spec):
                gate(record)
        else:
            pfl_blocks(spec, gate)
    except UserError as e:  # missing data files: one line, exit 2
        print(f"vs_pfl: {e}", file=sys.stderr)
        return 2
    return 0


def summarize(side: str, setup: dict, blocks: list[dict], tail: dict, spec: dict) -> dict:
    """One side's row: medians over the timed blocks (block 0 is compile and warm-up)."""
    timed = blocks[1:]
    per_round = lambda b: (sum(b["train_s"]) + b["eval_s"]) / len(b["train_s"])  # noqa: E731
    return {
        "side": side, **setup,
        "e2e_s_per_round": statistics.median(per_round(b) for b in timed),
        "train_s_per_round": statistics.median(sum(b["train_s"]) / len(b["train_s"]) for b in timed),
        "eval_s": statistics.median(b["eval_s"] for b in timed),
        "warmup_block_s": sum(blocks[0]["train_s"]) + blocks[0]["eval_s"],
        "rounds": timed[-1]["rounds"][1], "accuracy": timed[-1]["accuracy"],
        "accuracy_per_block": [round(b["accuracy"], 4) for b in blocks],
        "client_steps_per_round": timed[-1]["client_steps"] / len(timed[-1]["train_s"]),
        "block_e2e_s_per_round": [round(per_round(b), 4) for b in timed], **tail,
    }


def run(spec: dict, with_peer: bool, note: str | None, log_dir: str) -> list[dict]:
    sides = [s for s in SIDES if with_peer or s == "fedjax_pfl"]
    children = {s: Child(s, spec, os.path.join(log_dir, f"vs_pfl_{s}.log")) for s in sides}
    try:
        setups = {s: children[s].next(go=False) for s in sides}
        blocks = {s: [] for s in sides}
        for block in range(spec["blocks"] + 1):  # sides take turns, the first one alternating block by block
            for s in (sides if block % 2 == 0 else sides[::-1]):
                blocks[s].append(children[s].next())
        tails = {s: children[s].next() for s in sides}
        for child in children.values():
            child.proc.wait()
    finally:  # a side that failed stops the other
        for child in children.values():
            if child.proc.poll() is None:
                child.proc.kill()
    load = round(os.getloadavg()[0], 2)
    rows = [{"benchmark": "vs_pfl", "workload": workload_record(spec), "device": _device_name(spec), "load_avg_1min": load,
             **summarize(s, setups[s], blocks[s], tails[s], spec)} for s in sides]
    ours = rows[-1]
    theirs = rows[0] if with_peer else None
    ratio = lambda k: theirs[k] / ours[k] if theirs else None  # noqa: E731
    rows.append({"benchmark": "vs_pfl", "comparison": "pfl-research / fedjax_pfl", "device": ours["device"],
                 "ratio_e2e": ratio("e2e_s_per_round"), "ratio_train": ratio("train_s_per_round"),
                 "ratio_eval": ratio("eval_s"), "accuracy_pfl": theirs["accuracy"] if theirs else None,
                 "accuracy_fedjax_pfl": ours["accuracy"], "rounds": ours["rounds"], "load_avg_1min": load,
                 "peer_note": note})
    return rows


def workload_record(spec: dict) -> dict:
    keys = ("data", "clients", "images_per_client", "cohort", "local_epochs", "local_lr", "batch", "central_lr",
            "eval_every", "eval_batch", "test_images", "blocks", "seed")
    return {**{k: spec[k] for k in keys}, "model": "pfl_cnn / simple_cnn", "pfl_config": PFL_CONFIG}


def _device_name(spec: dict) -> str:
    if spec["device"] == "gpu":
        return "gpu (see each side's device)"
    from fedjax_pfl.outputs.machine import describe

    return describe()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 timed blocks of 10 rounds after block 0")
    p.add_argument("--tiny", action="store_true", help="tests: pfl-research's counts on random CIFAR-shaped data, "
                   "1,000 test images, an evaluation every round, 1 timed block")
    p.add_argument("--blocks", type=int, default=5, help="timed blocks of --eval-every rounds, after block 0")
    p.add_argument("--eval-every", type=int, default=PFL_CONFIG["eval_every"])
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="cpu: both on the CPU; gpu: pfl-research on torch CUDA, fedjax_pfl on JAX's GPU")
    p.add_argument("--cpu-devices", default="auto", help="fedjax_pfl's host devices on a CPU (devices.cpu)")
    p.add_argument("--client-mapping", default="auto", help="fedjax_pfl's client mapping (default: its timed choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-peer", action="store_true", help="time fedjax_pfl only")
    p.add_argument("--log-dir", default=None, help="the sides' logs (default: a temporary folder)")
    p.add_argument("--out", help="also append the rows to this JSONL file")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child_main(args.child[0], json.loads(args.child[1]))
    spec = {**{k: PFL_CONFIG[k] for k in ("clients", "images_per_client", "cohort", "local_epochs", "local_lr",
                                          "batch", "central_lr", "eval_batch", "central_rounds")},
            "data": "cifar10_jpeg", "test_images": 10000, "blocks": args.blocks, "eval_every": args.eval_every,
            "device": args.device, "cpu_devices": args.cpu_devices, "mapping": args.client_mapping, "seed": args.seed,
            "data_dir": os.environ.get("FEDJAX_PFL_DATA_DIR")}
    if args.quick:
        spec["blocks"] = 2
    if args.tiny:
        spec.update(data="random", test_images=1000, eval_every=1, blocks=1, mapping="map")
    note = "--no-peer given" if args.no_peer else peer_missing()
    if note:
        print(f"vs_pfl: {note}; timing fedjax_pfl alone", file=sys.stderr)
    import tempfile

    log_dir = args.log_dir or tempfile.mkdtemp(prefix="vs_pfl_")
    rows = run(spec, note is None, note, log_dir)
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
