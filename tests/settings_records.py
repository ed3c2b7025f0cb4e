"""`EngineConfig`, `LocalSetup` and `RunFacts` for tests that build an engine by hand.

Both are plain records without defaults; every value a test does not pass here
is its run setting's declared default (runs/config.py `TrainConfig`), built the
way runs/experiment.py builds them for a run.
"""

import dataclasses

from fedjax_pfl.methods.base import LocalSetup, RunFacts
from fedjax_pfl.runs import config, experiment


def engine_config(clients_per_round: int, **settings):
    """The engine record of train settings ``settings`` (e.g. ``client_mapping="vmap"``); the engine's own knobs
    (``shard``, ``stream_chunks``, ``largest_eval_batch``, ``progress``) among them are set on the record."""
    train = {k: v for k, v in settings.items() if k in config.TrainConfig.__dataclass_fields__}
    own = {k: v for k, v in settings.items() if k not in train}
    return dataclasses.replace(experiment.engine_config(config.TrainConfig(**train), clients_per_round), **own)


def local_setup(model, normalize, optimizer, lr, batch_size: int, local_epochs: int, augment=None,
                eval_model=None, **train):
    """The setup of ``model`` trained by ``optimizer`` (learning rate -> optax transformation, e.g. ``optax.sgd``)
    at ``lr``; ``train``: other train settings (drop_last, persistent_optimizer, share_batch_stats)."""
    t = config.TrainConfig(**train)
    return LocalSetup(model=model, optimizer=optimizer, lr=lr, batch_size=batch_size, local_epochs=local_epochs,
                      normalize=normalize, augment=augment, drop_last=t.drop_last,
                      persistent_optimizer=t.persistent_optimizer, share_batch_stats=t.share_batch_stats,
                      eval_model=eval_model, beyond_plain_sgd=experiment.beyond_plain_sgd(t))


def run_facts(setup: LocalSetup, num_clients: int | None = None) -> RunFacts:
    """What a run's validation gives a method's checks (`Algorithm.check_run`) for a run of ``setup``."""
    return RunFacts(model=setup.model, num_clients=num_clients, drop_last=setup.drop_last,
                    persistent_optimizer=setup.persistent_optimizer, beyond_plain_sgd=setup.beyond_plain_sgd)
