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
  Dense 10, cross-entropy; fedjax_pfl's twin is ``pfl_cnn`` with
  ``dropout=True`` (models/networks.py): the same network on both sides
  (``--no-dropout`` drops the dropout on both). pfl-research trains 1,500
  rounds; here ``--blocks`` timed blocks of 10 rounds.

Both sides get the same arrays: the project's CIFAR-10 copy
(``$FEDJAX_PFL_DATA_DIR/cifar10_jpeg``) loaded through ``fedjax_pfl.data``, the
clients cut by ``fedjax_pfl.data.partition.iid``, each client's images in a random
order (pfl-research's loader cuts its users from a permuted data set, and pfl
iterates a user's images in the order given; the copy here is stored by class,
so sorted indices gave every pfl client one-class batches in the same class
order, and pfl-research learned half as fast: 23.5% against 41.9% after 31
rounds in the first measurement), written once by the parent
to an .npz that each side reads (benchmarks/sides.py), and both start from the
same initial parameters (`initial_parameters`: pfl-research's Glorot-uniform
weights, PyTorch's default biases, drawn once in NumPy). Each side runs in its
own process, pfl-research in its own Python environment (``--peer-python``, or
``$FEDJAX_PFL_PEERS_PYTHON``, else this Python: pfl 0.6.0 pins an absl-py
older than chex wants), and they take turns: block 0 (the evaluation before training,
rounds 0-10, an evaluation: compile and warm-up) and then each block of 10
rounds and its evaluation run on one side while the other waits, sides
alternating. pfl-research is built with its public API (``FederatedDataset``,
``PyTorchModel``, ``SimulatedBackend``, ``FederatedAveraging``,
``CentralEvaluationCallback``; one process, its default without a launcher);
fedjax_pfl with its engine (``Engine.round``, ``Engine.evaluate``: each client
evaluated on 10 of the test images, so all 10,000 are seen once), the client
mapping its timed ``auto`` choice (cost reported apart; checked against its
estimate after block 0 as a training run checks it, ``mapping_check``) and,
on a CPU, the training command's host devices (``devices.cpu=auto``).

One JSON line per side and a comparison line: seconds per round end to end
(a block's rounds and its evaluation, over the rounds) and for training
alone, seconds per evaluation (medians over the timed blocks), the accuracy
on the 10,000 test images after each block (so nobody wins by learning less)
and the ratios pfl-research / fedjax_pfl. Without ``pfl`` (and torch) the
peer's row says why in one line and fedjax_pfl runs alone.

BlazeFL (PyPI ``blazefl``) is not compared: its release 3.0.0 requires Python
3.14 (benchmarks/RESULTS.md).

    python benchmarks/vs_pfl.py --quick --peer-python ~/venvs/peers/bin/python  # block 0, 2 timed blocks
    python benchmarks/vs_pfl.py --blocks 10          # 10 timed blocks (111 rounds per side)
    python benchmarks/vs_pfl.py --quick --device gpu # pfl-research on torch CUDA against fedjax_pfl on the GPU
    python benchmarks/vs_pfl.py --tiny               # tests: pfl-research's counts on random CIFAR-shaped data,
                                                     # 1,000 test images, an evaluation every round, 1 timed block
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import sides as sides_lib  # benchmarks/ is on sys.path

# pfl-research's benchmark configuration (benchmarks/image_classification/configs/baseline.yaml)
PFL_CONFIG = {"dataset": "cifar10_iid", "model": "simple_cnn", "algorithm": "fedavg", "clients": 1000,
              "images_per_client": 50, "cohort": 50, "local_epochs": 1, "local_lr": 0.1, "batch": 10,
              "central_lr": 1.0, "weight_by_samples": False, "eval_every": 10, "eval_batch": 10000,
              "central_rounds": 1500}
PEERS_PYTHON = "FEDJAX_PFL_PEERS_PYTHON"  # the environment variable naming pfl-research's interpreter
PEERS_INSTALL = ("python -m venv ~/venvs/peers && ~/venvs/peers/bin/pip install 'pfl==0.6.0' "
                 "'torch==2.13.0', then --peer-python ~/venvs/peers/bin/python (docs/benchmarks/index.md)")


# ------------------------------------------------------------------------------------ the shared workload --


def workload_arrays(spec: dict) -> dict:
    """The arrays both sides read (the parent writes them once): uint8 train and test images, labels, the train
    set's channel statistics, the clients' sample indices [clients, images_per_client] (each client's in a
    random order) and the initial parameters (``init/<name>``, `initial_parameters`)."""
    from fedjax_pfl.data import partition
    from fedjax_pfl.data.dataset import channel_stats

    if spec["data"] == "random":  # CIFAR-10's shapes, no files (tests)
        from common import random_cifar_like

        dataset = random_cifar_like(spec["clients"] * spec["images_per_client"], spec["test_images"])
    else:
        from fedjax_pfl.data.registry import load_dataset

        dataset = load_dataset("cifar10_jpeg", data_dir=spec.get("data_dir"))
    mean, std = channel_stats(dataset.x_train)  # the train set's own statistics, as pfl-research's loader
    # each client's images in a random order, as pfl-research's own loader cuts its users from a permuted data
    # set: pfl iterates a user's images in the order given, and this copy of CIFAR-10 is stored by class, so
    # sorted indices would give every pfl client batches of one or two classes in the same class order
    order = np.random.default_rng(spec["seed"])
    clients = np.stack([order.permutation(c) for c in partition.iid(dataset.y_train, spec["clients"], spec["seed"])])
    test = slice(0, min(spec["test_images"], len(dataset.y_test)))
    return {"x_train": dataset.x_train, "y_train": dataset.y_train.astype(np.int32), "x_test": dataset.x_test[test],
            "y_test": dataset.y_test[test].astype(np.int32), "mean": np.asarray(mean, np.float32),
            "std": np.asarray(std, np.float32), "clients": clients,
            **{f"init/{k}": v for k, v in initial_parameters(spec["seed"]).items()}}


def normalized(x: np.ndarray, arrays: dict) -> np.ndarray:
    """uint8 images as both sides' models take them: float32 (x / 255 - mean) / std per channel."""
    return (x.astype(np.float32) / np.float32(255.0) - arrays["mean"]) / arrays["std"]


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


# ------------------------------------------------------------------------------------ fedjax_pfl's side --


def fedjax_blocks(spec: dict):
    """Yields the setup record, then one record per block, then the peak memory: fedjax_pfl's engine
    (benchmarks/our_side.py) on the workload."""
    import jax

    import our_side
    from fedjax_pfl.data.dataset import Dataset

    if spec["device"] == "gpu" and jax.default_backend() != "gpu":
        raise SystemExit(f"vs_pfl: --device gpu, but JAX's backend is {jax.default_backend()}")
    a = sides_lib.load_arrays(spec["arrays"])
    dataset = Dataset("cifar10_jpeg", a["x_train"], a["y_train"], a["x_test"], a["y_test"], 10,
                      tuple(a["mean"].tolist()), tuple(a["std"].tolist()))
    fields = {"method_name": "fedavg", "model.name": "pfl_cnn", "model.dropout": spec["dropout"],
              "train.batch_size": spec["batch"], "train.local_epochs": spec["local_epochs"],
              "train.lr": spec["local_lr"], "seed": spec["seed"]}
    # the test images dealt 10 to a client (one evaluation batch each, as pfl-research's): each evaluated once
    tests = np.array_split(np.arange(len(dataset.y_test)), spec["clients"])
    params = as_flax_params({k[len("init/"):]: v for k, v in a.items() if k.startswith("init/")})
    side = our_side.build(dataset, list(a["clients"]), tests, fields, spec["cohort"] / spec["clients"], params,
                          spec["cpu_devices"] if spec["device"] == "cpu" else "", spec["mapping"],
                          spec["central_rounds"])
    yield side.setup
    blocks = [our_side.Block(r, frozenset([r[-1]]), eval_before=b == 0)
              for b, r in enumerate(block_rounds(b, spec["eval_every"]) for b in range(spec["blocks"] + 1))]
    yield from our_side.run_blocks(side, blocks, spec["central_rounds"])
    yield {"peak_memory_bytes": our_side.peak_memory_bytes(spec["device"])}


# -------------------------------------------------------------------------------------- pfl-research's side --


def simple_cnn(image_shape=(32, 32, 3), classes: int = 10, dropout: bool = True):
    """pfl-research's simple_cnn as its benchmark describes it (NHWC inputs; ``dropout=False``: without its two
    dropout layers), with the loss and metrics pfl's PyTorchModel asks of a model."""
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
            self.drop0, self.drop1 = (nn.Dropout(0.25), nn.Dropout(0.5)) if dropout else (nn.Identity(),) * 2

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
    a = sides_lib.load_arrays(spec["arrays"])
    to_tensor = lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(device)  # noqa: E731
    x_train = to_tensor(normalized(a["x_train"], a))
    y_train = to_tensor(a["y_train"].astype(np.int64))
    users = {u: [x_train[idx], y_train[idx]] for u, idx in enumerate(a["clients"])}
    federated = FederatedDataset.from_slices(users, get_user_sampler("random", list(users)))
    central = Dataset(raw_data=[to_tensor(normalized(a["x_test"], a)), to_tensor(a["y_test"].astype(np.int64))])
    module = simple_cnn(dropout=spec["dropout"]).to(device)
    module.load_state_dict({k[len("init/"):]: torch.from_numpy(v) for k, v in a.items() if k.startswith("init/")})
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
                  "torch_threads": torch.get_num_threads(), "clients_per_round": spec["cohort"],
                  "dropout": spec["dropout"], "python": sys.executable})
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
                                else sides_lib.process_peak_bytes())})


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


# ------------------------------------------------------------------------------------------ orchestration --


def child_main(side: str, spec: dict) -> int:
    if side == "pfl":  # pfl-research's environment: no fedjax_pfl package needed
        pfl_blocks(spec, sides_lib.gate)
        return 0
    return sides_lib.serve("vs_pfl", fedjax_blocks, spec)


def run(spec: dict, peer_python: str | None, note: str | None, log_dir: str) -> list[dict]:
    env = sides_lib.child_env(spec["device"])
    env.update(PFL_PYTORCH_DEVICE="cpu" if spec["device"] == "cpu" else "cuda")
    pythons = {"pfl": peer_python, "fedjax_pfl": sys.executable}
    children = [sides_lib.Side(name, python, __file__, ["--child", name, json.dumps(spec)], env,
                               os.path.join(log_dir, f"vs_pfl_{name}.log"))
                for name, python in pythons.items() if python]
    setups, blocks, tails = sides_lib.take_turns(children, spec["blocks"])
    load = round(os.getloadavg()[0], 2)
    rows = [{"benchmark": "vs_pfl", "workload": workload_record(spec), "device": _device_name(spec),
             "load_avg_1min": load, **sides_lib.summarize(c.name, setups[c.name], blocks[c.name], tails[c.name])}
            for c in children]
    ours = rows[-1]
    theirs = rows[0] if peer_python else None
    rows.append({"benchmark": "vs_pfl", "comparison": "pfl-research / fedjax_pfl", "device": ours["device"],
                 **sides_lib.ratios(theirs, ours), "accuracy_pfl": theirs["accuracy"] if theirs else None,
                 "accuracy_fedjax_pfl": ours["accuracy"], "rounds": ours["rounds"], "load_avg_1min": load,
                 "peer_note": note})
    return rows


def workload_record(spec: dict) -> dict:
    keys = ("data", "clients", "images_per_client", "cohort", "local_epochs", "local_lr", "batch", "central_lr",
            "eval_every", "eval_batch", "test_images", "blocks", "seed", "dropout")
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
    p.add_argument("--no-dropout", action="store_true", help="both sides without simple_cnn's dropout layers")
    sides_lib.add_options(p, "--peer-python", PEERS_PYTHON, "pfl-research")
    args = p.parse_args(argv)
    if args.child:
        return child_main(args.child[0], json.loads(args.child[1]))
    spec = {**{k: PFL_CONFIG[k] for k in ("clients", "images_per_client", "cohort", "local_epochs", "local_lr",
                                          "batch", "central_lr", "eval_batch", "central_rounds")},
            "data": "cifar10_jpeg", "test_images": 10000, "blocks": args.blocks, "eval_every": args.eval_every,
            "device": args.device, "cpu_devices": args.cpu_devices, "mapping": args.client_mapping, "seed": args.seed,
            "data_dir": os.environ.get("FEDJAX_PFL_DATA_DIR"), "dropout": not args.no_dropout}
    if args.quick:
        spec["blocks"] = 2
    if args.tiny:
        spec.update(data="random", test_images=1000, eval_every=1, blocks=1, mapping="map")
    found = (None, "--no-peer given") if args.no_peer else sides_lib.find_python(
        args.peer_python, "--peer-python", PEERS_PYTHON, ["pfl", "torch"], PEERS_INSTALL)
    return sides_lib.compare("vs_pfl", "pfl-research", found, spec, args.log_dir, workload_arrays, run, args.out)

if __name__ == "__main__":
    sys.exit(main())
