"""APPLE (Luo & Wu, IJCAI 2022): personalized models as learned mixes of all clients' core models.

Each client i owns a core model w_c,i and a directed-relationship vector p_i
[N]. The server keeps every client's latest core (`model_store`) and sends
them all. A selected client trains, for E epochs on its data,

    CE( sum_j p_ij w_c,j ) + coef(r) * ||p_i - p^0||^2      (`core_mixing`)

with respect to its OWN core and p_i only (the downloaded cores are fixed),
then uploads its core. The coefficient decays from mu to 0 over the first
``reg_rounds`` rounds (`core_mixing.proximal_coefficient`): early rounds keep
p_i near p^0 (FedAvg-like, the global objective), later rounds let each client
learn whom to rely on (the local objective).

Choices from the authors' code (ljaiverson/pFL-APPLE), where the paper is silent:
  - p_i is unconstrained (may leave the simplex) as in ``ClientNet.ps``; it
    starts at p^0 and the proximal term keeps it there while coef is large.
    ``method.simplex=true`` projects p_i onto the simplex after every step
    (a convex mix at all times);
  - the penalty is coef * ||p - p^0||^2 (no 1/2), coef = mu * 1e-3^(r/L) (the
    parser default 'exponential'; the cosine shape is ``method.schedule=cosine``),
    mu = 0.1; L is ``reg_rounds`` (the authors use 10% of the rounds: 16 of 160);
  - p_i is trained with SGD(p_lr = 0.001, momentum 0.9), the cores with the
    run's optimizer (train.*); optimizer states start fresh every round;
  - every core starts from its own random initialization (one ``Net`` per
    client); ``method.same_init=true`` gives all the same one;
  - p^0 = 1/N: the authors use n_j / sum n, which needs every client's size at
    init (not available to `Method.init`); the two agree when clients hold the
    same number of samples (e.g. the FMNIST/DiversiFed presets: 300 each);
  - all N cores are sent every round (the authors' default; their limited
    download budget is not implemented).
Models with BatchNorm are not supported (the mix of statistics is undefined).

Evaluation protocol: each client's personalized model sum_j p_ij w_c,j as it
stood at the end of its last local training (own trained core, the others'
cores as downloaded that round: the authors' ``ClientNet`` evaluation); a
client never selected holds the mix of the initial cores with p^0.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl import losses
from fedjax_pfl.kernels import core_mixing, model_store
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods.base import Method
from fedjax_pfl.methods.options import Options, option


@dataclasses.dataclass(frozen=True)
class APPLEConfig(Options):
    mu: float = option(0.1, "initial coefficient of the proximal term coef(r) ||p_i - p^0||^2", at_least=0.0)
    reg_rounds: int = option(16, "rounds L over which the coefficient decays to 0 (authors: 10% of the rounds)",
                             at_least=0)
    schedule: str = option("exponential", "decay shape of the coefficient", choices=core_mixing.SCHEDULES)
    p_lr: float = option(0.001, "SGD step size (momentum 0.9) of the relationship vector p_i", more_than=0.0)
    simplex: bool = option(False, "project p_i onto the probability simplex after every step")
    same_init: bool = option(False, "every client's core starts from the same initialization")


class APPLE(Method):
    name = "apple"
    hparams_type = APPLEConfig

    def init_variables(self, key):
        variables = self.model.init(key)
        if "batch_stats" in variables:
            raise UserError("method 'apple' supports models without BatchNorm (e.g. --model mlp, lenet, fedavgcnn)")
        return variables

    def init(self, key, num_clients):
        keys = jax.random.split(key, num_clients)
        if self.hparams.same_init:
            keys = jnp.broadcast_to(keys[:1], keys.shape)
        cores = jax.lax.map(self.init_variables, keys)
        p0 = core_mixing.initial_relationships(num_clients)
        personal = jax.tree.map(lambda c: jnp.tensordot(p0, c, axes=1), cores)
        clients = {"core": jax.tree.map(jnp.copy, cores), "p": jnp.tile(p0, (num_clients, 1)),
                   "variables": jax.tree.map(lambda a: jnp.broadcast_to(a, (num_clients,) + a.shape), personal),
                   "index": jnp.arange(num_clients, dtype=jnp.int32)}
        return {"cores": cores}, clients

    def relationship_optimizer(self):
        sgd = optax.sgd(self.hparams.p_lr, momentum=0.9)
        return optax.chain(sgd, core_mixing.onto_simplex()) if self.hparams.simplex else sgd

    def client_update(self, server, client, data, key, info):
        hp, index = self.hparams, client["index"]
        cores = server["cores"]["params"]
        p0 = core_mixing.initial_relationships(client["p"].shape[0])
        coef = core_mixing.proximal_coefficient(info.round, hp.mu, hp.reg_rounds, hp.schedule)

        def objective(v, batch, _key):
            own, p = v["params"]["core"], v["params"]["p"]
            mixed = core_mixing.mix_cores(p, cores, index, own)
            logits = self.model.apply({"params": mixed}, batch.x, train=True).logits
            loss = losses.cross_entropy(logits, batch.y, batch.mask)
            return loss + core_mixing.relationship_penalty(p, p0, coef), None

        optimizer = optax.multi_transform({"core": self.setup.optimizer, "p": self.relationship_optimizer()},
                                          {"core": "core", "p": "p"})
        start = {"params": {"core": client["core"]["params"], "p": client["p"]}}
        trained, loss = self.train(objective, start, data, key, info.epochs, optimizer=optimizer)
        own, p = trained["params"]["core"], trained["params"]["p"]
        personal = {"params": core_mixing.mix_cores(p, cores, index, own)}
        client = {**client, "core": {"params": own}, "p": p, "variables": personal}
        return client, {"core": {"params": own}, "loss": loss}

    def server_update(self, server, clients, uploads, info):
        return {"cores": model_store.store_arrived(server["cores"], info.selected, info.uploaded,
                                                   uploads["core"])}, clients
