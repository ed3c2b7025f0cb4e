"""fedjax_pfl against FedJAX (Google, PyPI ``fedjax`` 0.0.17) on FedJAX's own EMNIST FedAvg experiment.

The workload is FedJAX's FedAvg benchmark as its repository states it
(experiments/fed_avg/fed_avg.EMNIST_CONV.flags, run by run_fed_avg.py),
`FEDJAX_CONFIG`:

- the task EMNIST_CONV: federated EMNIST with 62 classes, 28x28x1 images
  (3,400 writers, 671,585 training and 77,483 test images), FedJAX's EMNIST
  CNN (``models.emnist.create_conv_model``: conv 3x3 32 VALID, ReLU, conv
  3x3 64 VALID, ReLU, 2x2 max-pool, dropout 0.25, flatten, Dense 128, ReLU,
  dropout 0.5, Dense 62; fedjax_pfl's ``pfl_cnn`` with ``dropout=True``),
  cross-entropy;
- 10 clients a round, each one epoch of SGD at learning rate 0.001 in
  batches of 10 (the last one partial);
- the server steps the model with Adam (learning rate 1.0, betas 0.9 and
  0.99, epsilon 0.01) along the clients' mean model difference weighted by
  their sample counts; on fedjax_pfl's side the method file
  benchmarks/fedavg_server_adam.py (``$FEDJAX_PFL_METHODS``);
- the model evaluated on the whole test set after round 1 and every 5
  rounds (batches of 128); FedJAX's script also evaluates the round's
  clients and 10 sampled test clients then (under 2% of the images): left
  out on both sides. FedJAX trains 1,500 rounds; here block 0 (rounds 1-5,
  two evaluations: compile and warm-up) and ``--blocks`` timed blocks of 5
  rounds and an evaluation.

EMNIST is not on this machine: the arrays have its shapes, cut from the
project's MNIST and Fashion-MNIST images (``$FEDJAX_PFL_DATA_DIR``; labels
0-9 and 10-19 of the 62): 3,400 clients whose training sizes are drawn from
a normal law with EMNIST's mean (197.5) and a spread of 39% of it (LEAF's
FEMNIST: 226.8 +- 88.9 images per writer), at least 10 each, scaled to
671,585 in all, each client's images drawn from the 120,000 training images
(a client holds no image twice; clients share images), and test sizes
proportional (77,483 in all) from the 20,000 test images. Pixels are
x / 255 on both sides (background 0, as FedJAX's EMNIST preprocessing gives).
Both sides start from the same initial parameters (`initial_parameters`:
Haiku's default initialiser for every weight, a normal truncated at two
standard deviations of 1 / sqrt(fan_in), zero biases, drawn once in NumPy).

Each side runs in its own process, FedJAX in its own Python environment
(``--fedjax-python`` or ``$FEDJAX_PFL_FEDJAX_PYTHON``; FedJAX 0.0.17 calls
``jax.tree_map``, gone from jax 0.6, and its pmap backend splits outputs as
jax 0.4 does: jax 0.4.30, docs/benchmarks/index.md), and they
take turns block by block (benchmarks/sides.py): FedJAX with its default
``for_each_client`` backend (jit: clients one after another, a jitted step
per batch), FedJAX with its ``pmap`` backend over the host's devices (one
per core, ``--xla_force_host_platform_device_count``), and fedjax_pfl
(benchmarks/our_side.py: its engine, the timed ``auto`` client mapping, the
training command's host devices). One JSON line per side and one comparison
line per FedJAX backend: seconds per round end to end and for training
alone, seconds per evaluation (medians over the timed blocks), the accuracy
on the test images after each block, and the ratios FedJAX / fedjax_pfl.
Without FedJAX the comparison says why in one line and fedjax_pfl runs alone.

    python benchmarks/vs_fedjax.py --quick --fedjax-python ~/venvs/fedjax/bin/python  # 4 timed blocks
    python benchmarks/vs_fedjax.py --blocks 10       # 10 timed blocks (55 rounds per side)
    python benchmarks/vs_fedjax.py --tiny            # tests: FedJAX's shapes and counts per round on random
                                                     # images, 30 clients of about 40, 1 timed block
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import sides as sides_lib  # benchmarks/ is on sys.path

# FedJAX's experiments/fed_avg/fed_avg.EMNIST_CONV.flags and the EMNIST-62 federated split it loads
FEDJAX_CONFIG = {"task": "EMNIST_CONV", "num_rounds": 1500, "num_clients_per_round": 10, "eval_frequency": 5,
                 "server_optimizer": "adam", "server_learning_rate": 1.0, "server_adam_beta1": 0.9,
                 "server_adam_beta2": 0.99, "server_adam_epsilon": 0.01, "client_optimizer": "sgd",
                 "client_learning_rate": 0.001, "client_training_batch_size": 10, "client_num_epochs": 1,
                 "eval_batch_size": 128, "clients": 3400, "train_images": 671585, "test_images": 77483,
                 "classes": 62, "image_shape": [28, 28, 1]}
SIZE_SPREAD = 88.94 / 226.83  # LEAF's FEMNIST images per writer: standard deviation over mean
FEDJAX_PYTHON = "FEDJAX_PFL_FEDJAX_PYTHON"  # the environment variable naming FedJAX's interpreter
FEDJAX_INSTALL = ("python -m venv ~/venvs/fedjax && ~/venvs/fedjax/bin/pip install 'fedjax==0.0.17' "
                  "'jax==0.4.30' 'jaxlib==0.4.30' 'dm-haiku==0.0.14' 'optax==0.2.4' 'numpy==2.0.2', then "
                  "--fedjax-python ~/venvs/fedjax/bin/python (docs/benchmarks/index.md)")
FEDJAX_SIDES = {"jit": "fedjax", "pmap": "fedjax_pmap"}  # FedJAX's for_each_client backend -> its side


# ------------------------------------------------------------------------------------ the shared workload --


def client_sizes(clients: int, total: int, seed: int) -> np.ndarray:
    """Sizes of ``clients`` clients, ``total`` in all: normal with the mean total / clients and `SIZE_SPREAD`
    of it as standard deviation, at least 10 each (half the mean where that is less)."""
    rng = np.random.default_rng(seed)
    mean, floor = total / clients, max(1, min(10, total // (2 * clients)))
    sizes = np.maximum(floor, np.round(rng.normal(mean, SIZE_SPREAD * mean, clients))).astype(np.int64)
    sizes = np.maximum(floor, np.round(sizes * total / sizes.sum())).astype(np.int64)
    gap = int(total - sizes.sum())  # rounding: a sample more or less for a few clients (none below the floor)
    able = np.flatnonzero(sizes > floor) if gap < 0 else np.arange(clients)
    sizes[rng.choice(able, abs(gap), replace=False)] += np.sign(gap)
    return sizes


def draw_clients(sizes: np.ndarray, pool: int, rng) -> np.ndarray:
    """Each client's sample indices into a pool of ``pool`` images (none twice within a client), concatenated."""
    return np.concatenate([rng.choice(pool, int(n), replace=False) for n in sizes]).astype(np.int32)


def initial_parameters(seed: int, classes: int = 62) -> dict:
    """The EMNIST CNN's initial parameters by their Haiku names (HWIO kernels, [in, out] weights, as Flax's):
    each weight normal with standard deviation 1 / sqrt(fan_in) truncated at two of them, biases 0."""
    rng = np.random.default_rng(seed)
    shapes = {"conv2_d": (3, 3, 1, 32), "conv2_d_1": (3, 3, 32, 64), "linear": (12 * 12 * 64, 128),
              "linear_1": (128, classes)}
    out = {}
    for name, shape in shapes.items():
        std = 1.0 / np.sqrt(np.prod(shape[:-1]))
        w = rng.normal(0.0, 1.0, shape)
        while (bad := np.abs(w) > 2).any():
            w[bad] = rng.normal(0.0, 1.0, int(bad.sum()))
        out[f"{name}/w"], out[f"{name}/b"] = (w * std).astype(np.float32), np.zeros(shape[-1], np.float32)
    return out


def as_flax_params(p: dict) -> dict:
    """`initial_parameters` as fedjax_pfl's ``pfl_cnn`` parameter tree (the same layouts)."""
    dense = lambda name: {"kernel": p[f"{name}/w"], "bias": p[f"{name}/b"]}  # noqa: E731
    return {"body": {"conv0": dense("conv2_d"), "conv1": dense("conv2_d_1"), "mlp": {"dense0": dense("linear")}},
            "head": {"logits": dense("linear_1")}}


def workload_arrays(spec: dict) -> dict:
    """The arrays every side reads (the parent writes them once): the image pools (uint8), their labels, each
    client's train and test sample indices (concatenated, with the sizes) and the initial parameters."""
    rng = np.random.default_rng(spec["seed"])
    if spec["data"] == "random":  # FedJAX's shapes on random images, no files (tests)
        x_pool = rng.integers(0, 256, (4000, 28, 28, 1), dtype=np.uint8)
        y_pool = rng.integers(0, 20, 4000).astype(np.int32)
        x_test_pool, y_test_pool = x_pool[:1000], y_pool[:1000]
    else:
        from fedjax_pfl.data.registry import load_dataset

        mnist = load_dataset("mnist", data_dir=spec.get("data_dir"))
        fashion = load_dataset("fashion_mnist", data_dir=spec.get("data_dir"))
        x_pool = np.concatenate([mnist.x_train, fashion.x_train])
        y_pool = np.concatenate([mnist.y_train, fashion.y_train + 10]).astype(np.int32)
        x_test_pool = np.concatenate([mnist.x_test, fashion.x_test])
        y_test_pool = np.concatenate([mnist.y_test, fashion.y_test + 10]).astype(np.int32)
    train_sizes = client_sizes(spec["clients"], spec["train_images"], spec["seed"])
    test_sizes = client_sizes(spec["clients"], spec["test_images"], spec["seed"] + 1)
    return {"x_pool": x_pool, "y_pool": y_pool, "x_test_pool": x_test_pool, "y_test_pool": y_test_pool,
            "train_sizes": train_sizes, "train_index": draw_clients(train_sizes, len(y_pool), rng),
            "test_sizes": test_sizes, "test_index": draw_clients(test_sizes, len(y_test_pool), rng),
            **{f"init/{k}": v for k, v in initial_parameters(spec["seed"]).items()}}


def split(index: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """Concatenated per-client indices cut back into one array per client."""
    return np.split(index, np.cumsum(sizes)[:-1])


def blocks_of(spec: dict) -> list[list[int]]:
    """Each block's rounds (0-based): block 0 the first ``eval_every``, each later block the next; an evaluation
    follows round 0 and every round t with (t + 1) % eval_every == 0 (FedJAX's round 1 and multiples of 5)."""
    e = spec["eval_every"]
    return [list(range(b * e, (b + 1) * e)) for b in range(spec["blocks"] + 1)]


def evaluated_after(t: int, eval_every: int) -> bool:
    return t == 0 or (t + 1) % eval_every == 0


# ------------------------------------------------------------------------------------ fedjax_pfl's side --


def fedjax_pfl_blocks(spec: dict):
    """Yields the setup record, one record per block and the peak memory: fedjax_pfl's engine on the workload
    with the FedAvg-with-server-Adam method file."""
    import our_side
    from fedjax_pfl.data.dataset import Dataset

    a = sides_lib.load_arrays(spec["arrays"])
    classes = FEDJAX_CONFIG["classes"]
    dataset = Dataset("emnist_shaped", a["x_pool"], a["y_pool"], a["x_test_pool"], a["y_test_pool"], classes,
                      (0.0,), (1.0,))  # x / 255
    fields = {"method_name": "fedavg_server_adam", "model.name": "pfl_cnn", "model.dropout": True,
              "train.batch_size": spec["batch"], "train.local_epochs": spec["local_epochs"],
              "train.lr": spec["local_lr"], "seed": spec["seed"]}
    side = our_side.build(dataset, split(a["train_index"], a["train_sizes"]), split(a["test_index"], a["test_sizes"]),
                          fields, spec["cohort"] / spec["clients"],
                          as_flax_params({k[len("init/"):]: v for k, v in a.items() if k.startswith("init/")}),
                          spec["cpu_devices"], spec["mapping"], spec["rounds_total"])
    yield side.setup
    blocks = [our_side.Block(range(r[0], r[-1] + 1), frozenset(t for t in r if evaluated_after(t, spec["eval_every"])))
              for r in blocks_of(spec)]
    yield from our_side.run_blocks(side, blocks, spec["rounds_total"])
    yield {"peak_memory_bytes": our_side.peak_memory_bytes("cpu")}


# ---------------------------------------------------------------------------------------- FedJAX's side --


def fedjax_blocks(spec: dict, backend: str):
    """Yields the setup record, one record per block and the peak memory: FedJAX's fed_avg on the workload,
    its clients run by the ``for_each_client`` backend ``backend`` ('jit' or 'pmap'), built as
    run_fed_avg.py builds it (its public API: fedjax.algorithms.fed_avg, UniformGetClientSampler,
    ModelFullEvaluationFn)."""
    import fedjax
    import jax

    fedjax.set_for_each_client_backend(backend)
    a = sides_lib.load_arrays(spec["arrays"])

    def federated(x, y, index, sizes):
        data = {f"{c:04d}".encode(): {"x": x[i], "y": y[i]} for c, i in enumerate(split(index, sizes))}
        return fedjax.InMemoryFederatedData(data).preprocess_batch(
            lambda b: {**b, "x": b["x"].astype(np.float32) / np.float32(255.0)})  # x / 255, as our side's

    train = federated(a["x_pool"], a["y_pool"], a["train_index"], a["train_sizes"])
    test = federated(a["x_test_pool"], a["y_test_pool"], a["test_index"], a["test_sizes"])
    model = fedjax.models.emnist.create_conv_model(only_digits=False)
    c = FEDJAX_CONFIG
    algorithm = fedjax.algorithms.fed_avg.federated_averaging(
        grad_fn=fedjax.model_grad(model),
        server_optimizer=fedjax.optimizers.adam(spec["server_lr"], c["server_adam_beta1"], c["server_adam_beta2"],
                                                c["server_adam_epsilon"]),
        client_optimizer=fedjax.optimizers.sgd(spec["local_lr"]),
        client_batch_hparams=fedjax.ShuffleRepeatBatchHParams(batch_size=spec["batch"],
                                                              num_epochs=spec["local_epochs"]))
    params = {f"conv_dropout_module/{layer}": {w: jax.numpy.asarray(a[f"init/{layer}/{w}"]) for w in ("w", "b")}
              for layer in ("conv2_d", "conv2_d_1", "linear", "linear_1")}
    template = model.init(jax.random.PRNGKey(0))  # the same names and shapes as FedJAX's own initial model
    assert jax.tree_util.tree_map(np.shape, template) == jax.tree_util.tree_map(np.shape, params)
    state = algorithm.init(params)
    sampler = fedjax.client_samplers.UniformGetClientSampler(train, spec["cohort"], seed=spec["seed"] + 2)
    evaluate_all = fedjax.training.ModelFullEvaluationFn(test, model,
                                                         fedjax.PaddedBatchHParams(batch_size=spec["eval_batch"]))
    yield {"fedjax": _version("fedjax"), "jax": jax.__version__, "haiku": _version("dm-haiku"),
           "backend": jax.default_backend(), "for_each_client": backend, "devices": jax.device_count(),
           "clients_per_round": spec["cohort"], "dropout": True, "python": sys.executable}
    for index, rounds in enumerate(blocks_of(spec)):
        train_s, eval_s, accuracy, steps = [], 0.0, None, 0
        for t in rounds:
            sampler.set_round_num(t + 1)  # FedJAX's rounds count from 1
            clients = sampler.sample()
            start = time.perf_counter()
            state, _ = algorithm.apply(state, clients)
            jax.block_until_ready(state.params)
            train_s.append(time.perf_counter() - start)
            steps += sum(-(-len(ds) // spec["batch"]) * spec["local_epochs"] for _, ds, _ in clients)
            if evaluated_after(t, spec["eval_every"]):
                start = time.perf_counter()
                metrics = evaluate_all(state, t + 1)
                accuracy = float(metrics["accuracy"])
                eval_s += time.perf_counter() - start
        yield {"block": index, "rounds": [rounds[0], rounds[-1] + 1], "train_s": train_s, "eval_s": eval_s,
               "accuracy": accuracy, "client_steps": steps}
    yield {"peak_memory_bytes": sides_lib.process_peak_bytes()}


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


# ------------------------------------------------------------------------------------------ orchestration --


def child_main(side: str, spec: dict) -> int:
    backend = {name: b for b, name in FEDJAX_SIDES.items()}.get(side)
    if backend:  # FedJAX's environment: no fedjax_pfl package needed
        for record in fedjax_blocks(spec, backend):
            sides_lib.gate(record)
        return 0
    return sides_lib.serve("vs_fedjax", fedjax_pfl_blocks, spec)


def run(spec: dict, fedjax_python: str | None, note: str | None, log_dir: str, backends: list[str]) -> list[dict]:
    env = sides_lib.child_env("cpu")
    here = os.path.dirname(os.path.abspath(__file__))
    ours_env = {**env, "FEDJAX_PFL_METHODS": os.path.join(here, "fedavg_server_adam.py")}
    cores = os.cpu_count() or 1
    pmap_env = {**env, "XLA_FLAGS": f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={cores}"}
    plan = [(FEDJAX_SIDES[b], fedjax_python, pmap_env if b == "pmap" else env) for b in backends if fedjax_python]
    plan.append(("fedjax_pfl", sys.executable, ours_env))
    children = [sides_lib.Side(name, python, __file__, ["--child", name, json.dumps(spec)], e,
                               os.path.join(log_dir, f"vs_fedjax_{name}.log")) for name, python, e in plan]
    setups, blocks, tails = sides_lib.take_turns(children, spec["blocks"])
    load = round(os.getloadavg()[0], 2)
    from fedjax_pfl.outputs.machine import describe

    device = describe()
    rows = [{"benchmark": "vs_fedjax", "workload": workload_record(spec), "device": device, "load_avg_1min": load,
             **sides_lib.summarize(c.name, setups[c.name], blocks[c.name], tails[c.name])} for c in children]
    ours = rows[-1]
    for theirs in rows[:-1] or [None]:
        name = theirs["side"] if theirs else "fedjax"
        rows.append({"benchmark": "vs_fedjax", "comparison": f"{name} / fedjax_pfl", "device": device,
                     **sides_lib.ratios(theirs, ours), "accuracy_fedjax": theirs["accuracy"] if theirs else None,
                     "accuracy_fedjax_pfl": ours["accuracy"], "rounds": ours["rounds"], "load_avg_1min": load,
                     "peer_note": note})
    return rows


def workload_record(spec: dict) -> dict:
    keys = ("data", "clients", "train_images", "test_images", "cohort", "local_epochs", "local_lr", "batch",
            "server_lr", "eval_every", "eval_batch", "blocks", "seed")
    return {**{k: spec[k] for k in keys}, "model": "pfl_cnn(dropout=True) / fedjax.models.emnist conv",
            "fedjax_config": FEDJAX_CONFIG}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="4 timed blocks of 5 rounds after block 0")
    p.add_argument("--tiny", action="store_true", help="tests: FedJAX's counts per round and shapes on random "
                   "images, 30 clients of about 40, 1 timed block")
    p.add_argument("--blocks", type=int, default=10, help="timed blocks of 5 rounds, after block 0")
    p.add_argument("--backends", default="jit,pmap", help="FedJAX's for_each_client backends to time")
    sides_lib.add_options(p, "--fedjax-python", FEDJAX_PYTHON, "FedJAX")
    args = p.parse_args(argv)
    if args.child:
        return child_main(args.child[0], json.loads(args.child[1]))
    c = FEDJAX_CONFIG
    spec = {"data": "mnist_fashion", "clients": c["clients"], "train_images": c["train_images"],
            "test_images": c["test_images"], "cohort": c["num_clients_per_round"],
            "local_epochs": c["client_num_epochs"], "local_lr": c["client_learning_rate"],
            "batch": c["client_training_batch_size"], "server_lr": c["server_learning_rate"],
            "eval_every": c["eval_frequency"], "eval_batch": c["eval_batch_size"], "blocks": args.blocks,
            "rounds_total": c["num_rounds"], "cpu_devices": args.cpu_devices, "mapping": args.client_mapping,
            "seed": args.seed, "data_dir": os.environ.get("FEDJAX_PFL_DATA_DIR")}
    if args.quick:
        spec["blocks"] = 4
    if args.tiny:
        spec.update(data="random", clients=30, train_images=30 * 40, test_images=30 * 5, blocks=1, mapping="map")
    if set(args.backends.split(",")) - set(FEDJAX_SIDES):
        p.error(f"--backends: FedJAX's for_each_client backends are {', '.join(FEDJAX_SIDES)}")
    found = (None, "--no-peer given") if args.no_peer else sides_lib.find_python(
        args.fedjax_python, "--fedjax-python", FEDJAX_PYTHON, ["fedjax", "haiku"], FEDJAX_INSTALL)
    backends = args.backends.split(",")
    return sides_lib.compare("vs_fedjax", "FedJAX", found, spec, args.log_dir, workload_arrays,
                             lambda *a: run(*a, backends), args.out)

if __name__ == "__main__":
    sys.exit(main())
