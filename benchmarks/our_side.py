"""fedjax_pfl's side of a comparison with another simulator (benchmarks/vs_pfl.py, vs_fedjax.py).

`build` makes the engine the training command would make for a workload
(the method by name, the model, batch size, epochs and learning rate from
RunConfig fields), on the client arrays the parent wrote, starting from the
given initial parameters, with the client mapping's timed ``auto`` choice
(engine/mapping_choice.py) and, on a CPU, the training command's host
devices. `run_blocks` runs the workload's blocks of rounds and evaluations,
timing each round's training and each evaluation, and checks the mapping
against its estimate after block 0 as a training run does
(`mapping_choice.retime`).
"""

from __future__ import annotations

import sys
import time
from typing import NamedTuple

import numpy as np


class Block(NamedTuple):
    """The rounds of a block (0-based), the rounds after which the global model is evaluated, and whether it
    is evaluated before the first round too."""

    rounds: range
    eval_after: frozenset
    eval_before: bool = False


class Side(NamedTuple):
    engine: object
    choice: dict
    server: dict
    clients: dict
    key: object
    setup: dict


def build(dataset, clients: list, test_clients: list, fields: dict, join_ratio: float, params, cpu_devices: str,
          mapping: str, rounds_total: int) -> Side:
    """fedjax_pfl on ``dataset``'s clients (``clients``: train sample indices per client, ``test_clients``:
    test sample indices per client) with the RunConfig ``fields`` (``method_name`` among them), ``join_ratio``
    of them a round, the global parameters ``params`` (a tree like the model's) at the start, client mapping
    ``mapping`` ('auto': timed) for a run of ``rounds_total`` rounds."""
    from fedjax_pfl.runs import host_devices

    devices = host_devices.apply(cpu_devices) if cpu_devices else {"why": "not on a CPU"}
    import jax

    from common import run_config
    from fedjax_pfl.data.client_data import stack_clients
    from fedjax_pfl.engine import mapping_choice
    from fedjax_pfl.engine.engine import Engine, clients_per_round, round_keys
    from fedjax_pfl.methods import get_method
    from fedjax_pfl.runs import config as config_lib
    from fedjax_pfl.runs.experiment import build_setup, engine_config

    cfg = run_config(**fields)
    method_cls = get_method(cfg.method_name)
    method = method_cls(build_setup(cfg, dataset), config_lib.method_options(method_cls.hparams_type, {}))
    train = stack_clients(dataset.x_train, dataset.y_train, clients)
    test = stack_clients(dataset.x_test, dataset.y_test, test_clients)
    engine = Engine(method, train, test, engine_config(cfg.train, clients_per_round(len(clients), join_ratio)))
    key = jax.random.key(cfg.seed)
    server, client_states = engine.init(key)
    server["variables"]["params"] = jax.tree.map(lambda a, b: jax.device_put(np.asarray(b, a.dtype), a.sharding),
                                                 server["variables"]["params"], params)
    engine, choice = mapping_choice.choose_or_default(engine, mapping, rounds_total, server, client_states,
                                                      round_keys(key, 0)[0], 0)
    n = np.asarray(train.n)
    setup = {"jax": jax.__version__, "backend": jax.default_backend(), "devices": jax.device_count(),
             "devices_why": devices["why"], "method": cfg.method_name, "client_mapping": str(engine.mapping),
             "mapping_choice": choice, "mapping_choice_s": choice.get("seconds", 0.0),
             "clients_per_round": engine.config.clients_per_round, "dropout": method.model.dropout,
             "train_images_per_client": [int(n.min()), int(n.max())], "test_images": int(np.asarray(test.n).sum())}
    return Side(engine, choice, server, client_states, key, setup)


def run_blocks(side: Side, blocks: list[Block], rounds_total: int):
    """Yields one record per block: each round's training seconds (``train_s``), the block's evaluation seconds
    (``eval_s``), the accuracy over every test sample after it, the real client-steps it took; block 0's also
    ``mapping_check``: its rounds after the first (compiled) one against the mapping's estimate."""
    import jax

    from fedjax_pfl.engine import mapping_choice
    from fedjax_pfl.engine.engine import round_keys, summarize_evaluation

    engine, choice, server, clients, key = side.engine, side.choice, side.server, side.clients, side.key

    def evaluate(t):
        start = time.perf_counter()
        out = engine.evaluate(server, clients, round_keys(key, t)[1])
        return time.perf_counter() - start, summarize_evaluation(out)["accuracy_weighted"]

    for index, block in enumerate(blocks):
        eval_s, accuracy, train_s, real = 0.0, None, [], 0
        if block.eval_before:
            eval_s, accuracy = evaluate(block.rounds[0])
        for t in block.rounds:
            start = time.perf_counter()
            server, clients, metrics = engine.round(server, clients, round_keys(key, t)[0], t)
            jax.block_until_ready((server, clients, metrics))
            train_s.append(time.perf_counter() - start)
            real += int(metrics["real_steps"])
            if t in block.eval_after:
                seconds, accuracy = evaluate(t)
                eval_s += seconds
        checked = {}
        if index == 0 and len(train_s) > 1:
            ran, after = float(np.median(train_s[1:])), block.rounds[-1] + 1
            engine, choice = mapping_choice.retime(engine, choice, ran, server, clients, round_keys(key, after)[0],
                                                   after, rounds_total - after,
                                                   report=lambda line: print(line, file=sys.stderr, flush=True))
            checked = {"mapping_check": {"ran_s": round(ran, 4), "chosen": choice["chosen"],
                                         "retimed": choice.get("retimed")}}
        yield {"block": index, "rounds": [block.rounds[0], block.rounds[-1] + 1], "train_s": train_s,
               "eval_s": eval_s, "accuracy": accuracy, "client_steps": real, **checked}


def peak_memory_bytes(device: str) -> int:
    """The accelerator's peak bytes in use on a GPU, else the process's peak resident memory."""
    import jax

    from sides import process_peak_bytes

    stats = jax.devices()[0].memory_stats() if device == "gpu" else None
    return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else process_peak_bytes()
