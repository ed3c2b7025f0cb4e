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

PFLlib's protocol (TsingZ0/PFLlib clientapple.py / serverapple.py, which the
DiversiFed paper ran; configs/tables/diversifed_table*.yaml set it):
  - every core starts from the same initialization: ``same_init=true``;
  - after its local training a client's core becomes its personalized mix
    (PFLlib's ``model_c = deepcopy(model)``), which is what it uploads, so the
    server sends the clients' mixes around: ``core_after_round=mix``;
  - p_i moves slowly: plain SGD (``p_momentum=0``) at ``p_lr`` (PFLlib's
    ``dr_learning_rate``) on PFLlib's layer-averaged gradient, for each j the
    mean over the parameter tensors of mean(g * w_c,j) over each tensor's
    elements, g the gradient at the personalized model
    (``p_gradient=layer_mean``; `core_mixing.layer_mean_relationships`);
  - the coefficient's cosine shape over L x rounds with L = 1 and mu = 0
    (PFLlib's defaults: ``schedule=cosine``, ``reg_rounds`` = the rounds,
    ``mu=0``), so nothing pulls p back to p^0.
  - the clients train one after another (``sequential=true``), each mixing
    the cores that the clients before it trained this round (PFLlib's clients
    step their cores in place, in the list all clients share) and the
    others' cores as sent at the round's start: within a round the clients'
    progress accumulates, as in sequential SGD over clients, where clients
    that all start from the sent cores would each move their mix by only
    p_ii of their own progress. The engine visits the selected clients in
    the round's order (PFLlib: every client, by index).
  - the core steps as PFLlib's clients step it by hand: plain SGD at N x the
    run's lr on its gradient through the mix, p_ii times the personalized
    model's (``core_step=pfllib``; PFLlib's optimizer object goes unused). At
    the DiversiFed presets' Adam lr 1e-3 that is plain SGD at about 1e-3 on
    the mix, which stalls (72% on the Dirichlet(1.0) preset after 200 rounds,
    Local 83%), so the DiversiFed tables keep the run's Adam on the core
    (``core_step=run``) and add ``simplex=true``: with p unconstrained, its
    total weight sum_j |p_ij| drifts above 1 (1.02 at round 400, 1.065 at 480
    on that preset), each round's mixes then extrapolate the cores instead of
    averaging them, and the cores' spread grows until the run diverges (two
    seeds of three there, at rounds 487 and 419; mean distance between the
    cores 18 at round 400, 1,036 at 486).
Where this library differs from PFLlib there: the clients are the round's
selected ones (PFLlib's APPLE trains all of them whatever the join ratio).

Evaluation protocol: each client's personalized model sum_j p_ij w_c,j as it
stood at the end of its last local training (own trained core, the others'
cores as downloaded that round: the authors' ``ClientNet`` evaluation); a
client never selected holds the mix of the initial cores with p^0.

Diagnostics (`round_diagnostics`): the selected clients' mean p_ii after
training, their mass sum_{j != i} |p_ij| on the others' cores, and the
distances of the cores the server sent.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl import losses
from fedjax_pfl.kernels import collaboration, core_mixing, model_store
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods import training
from fedjax_pfl.methods.base import Algorithm, Paper, RunFacts, Schedule
from fedjax_pfl.methods.options import Options, option


P_GRADIENTS = ("exact", "layer_mean")
CORES_AFTER_ROUND = ("trained", "mix")
CORE_STEPS = ("run", "pfllib")


@dataclasses.dataclass(frozen=True)
class APPLEConfig(Options):
    mu: float = option(0.1, "initial coefficient of the proximal term coef(r) ||p_i - p^0||^2", at_least=0.0)
    reg_rounds: int = option(16, "rounds L over which the coefficient decays to 0 (authors: 10% of the rounds)",
                             at_least=0)
    schedule: str = option("exponential", "decay shape of the coefficient", choices=core_mixing.SCHEDULES)
    p_lr: float = option(0.001, "SGD step size of the relationship vector p_i", more_than=0.0)
    p_momentum: float = option(0.9, "SGD momentum of p_i (authors 0.9, PFLlib 0)", at_least=0.0, less_than=1.0)
    p_gradient: str = option("exact", "gradient of p_i: the exact one (authors) or PFLlib's layer-averaged one",
                             choices=P_GRADIENTS)
    simplex: bool = option(False, "project p_i onto the probability simplex after every step")
    same_init: bool = option(False, "every client's core starts from the same initialization")
    core_after_round: str = option("trained", "a client's core after its round: its trained core (authors) or "
                                   "its personalized mix (PFLlib)", choices=CORES_AFTER_ROUND)
    sequential: bool = option(False, "clients train one after another, each mixing the cores the earlier ones "
                              "trained this round (PFLlib); else each the cores sent at the round's start")
    core_step: str = option("run", "how a client steps its core: the run's optimizer (authors) or PFLlib's "
                            "by-hand step, plain SGD at N x train.lr on the core's gradient through the mix",
                            choices=CORE_STEPS)


def check(name, options, facts: RunFacts) -> None:
    """Its cores are mixed parameter by parameter: a model with BatchNorm is refused."""
    if facts.model is not None and "batch_stats" in facts.variables:
        raise UserError(f"method {name!r} supports models without BatchNorm (e.g. --model mlp, lenet, fedavgcnn)")


def schedule(hparams) -> Schedule:
    """sequential: the engine visits the clients one after another, the server storing each one's cores."""
    return Schedule(server_steps_per_client=hparams.sequential)


def init(m, key, num_clients):
    """Every client's core (its own initialization unless ``same_init``), p_i = p^0 and its mixed model."""
    keys = jax.random.split(key, num_clients)
    if m.hparams.same_init:
        keys = jnp.broadcast_to(keys[:1], keys.shape)
    cores = jax.lax.map(m.model.init, keys)
    p0 = core_mixing.initial_relationships(num_clients)
    personal = jax.tree.map(lambda c: jnp.tensordot(p0, c, axes=1), cores)
    copy = lambda tree: jax.tree.map(jnp.copy, tree)  # noqa: E731  distinct buffers: the engine donates state
    clients = {"core": copy(cores), "p": jnp.tile(p0, (num_clients, 1)),
               "variables": jax.tree.map(lambda a: jnp.broadcast_to(a, (num_clients,) + a.shape), personal),
               "index": jnp.arange(num_clients, dtype=jnp.int32)}
    server = {"cores": cores}
    if m.hparams.sequential:  # this round's trained cores, and the round each was trained in
        server.update(trained=copy(cores), trained_round=jnp.full((num_clients,), -1, jnp.int32))
    return server, clients


def cores_seen(m, server, round_index):
    """The cores a client mixes: as sent at the round's start, or (sequential) the cores the clients
    before it trained this round where they have."""
    if not m.hparams.sequential:
        return server["cores"]["params"]
    fresh = server["trained_round"] == round_index
    return jax.tree.map(lambda t, c: jnp.where(fresh.reshape((-1,) + (1,) * (c.ndim - 1)), t, c),
                        server["trained"]["params"], server["cores"]["params"])


def relationship_optimizer(m):
    """SGD of p_i (projected onto the simplex with ``simplex``)."""
    hp = m.hparams
    sgd = optax.sgd(hp.p_lr, momentum=hp.p_momentum or None)
    return optax.chain(sgd, core_mixing.onto_simplex()) if hp.simplex else sgd


def core_optimizer(m, num_clients: int):
    """The run's optimizer, or PFLlib's hand-written core step: core -= N lr p_ii grad (clientapple.py; the
    gradient through the mix already carries the p_ii)."""
    if m.hparams.core_step == "run":
        return m.optimizer
    return optax.sgd(num_clients * m.lr)


def client_update(m, server, client, data, key, info):
    """E epochs of CE of the mixed model (+ the proximal term on p_i) on the own core and p_i; upload the core."""
    hp, index = m.hparams, client["index"]
    cores = cores_seen(m, server, info.round)
    p0 = core_mixing.initial_relationships(client["p"].shape[0])
    coef = core_mixing.proximal_coefficient(info.round, hp.mu, hp.reg_rounds, hp.schedule)

    def objective(v, batch, _key):
        own, p = v["params"]["core"], v["params"]["p"]
        q = core_mixing.layer_mean_relationships(p, cores) if hp.p_gradient == "layer_mean" else p
        mixed = core_mixing.mix_cores(q, cores, index, own)
        logits = m.model.apply({"params": mixed}, batch.x, train=True).logits
        loss = losses.cross_entropy(logits, batch.y, batch.mask)
        return loss + core_mixing.relationship_penalty(p, p0, coef), None

    optimizer = optax.multi_transform({"core": core_optimizer(m, client["p"].shape[0]),
                                       "p": relationship_optimizer(m)}, {"core": "core", "p": "p"})
    start = {"params": {"core": client["core"]["params"], "p": client["p"]}}
    trained, loss = training.train(m.local, objective, start, data, key, info.epochs, optimizer=optimizer)
    own, p = trained["params"]["core"], trained["params"]["p"]
    personal = {"params": core_mixing.mix_cores(p, cores, index, own)}
    core = personal if hp.core_after_round == "mix" else {"params": own}
    client = {**client, "core": core, "p": p, "variables": personal}
    shares = collaboration.own_and_others(p, jnp.arange(p.shape[0]) == index)
    upload = {"core": core, "loss": loss, "collaboration": shares}
    if hp.sequential:  # what the clients after it see this round
        upload["trained"] = {"params": own}
    return client, upload


def round_diagnostics(m, server, new_server, uploads, info):
    """The selected clients' p_ii and mass on the others' cores; the distances of the cores sent."""
    return {**collaboration.client_means(uploads["collaboration"]),
            **collaboration.distance_summary(server["cores"]["params"])}


def server_update(m, server, clients, uploads, info):
    """Store the arrived cores (sequential: also as this round's trained cores)."""
    store = lambda old, new: model_store.store_arrived(old, info.selected, info.uploaded, new)  # noqa: E731
    new = {"cores": store(server["cores"], uploads["core"])}
    if m.hparams.sequential:
        new.update(trained=store(server["trained"], uploads["trained"]),
                   trained_round=store(server["trained_round"], jnp.full(info.selected.shape, info.round)))
    return new, clients


APPLE = Algorithm(
    name="apple",
    paper=Paper("APPLE", authors="Jun Luo, Shandong Wu", title="Adapt to Adaptation: Learning Personalization for "
                "Cross-Silo Federated Learning", venue="IJCAI", year=2022, url="https://arxiv.org/abs/2110.08394",
                code="ljaiverson/pFL-APPLE"),
    hparams_type=APPLEConfig,
    schedule=schedule,
    check=check,
    init=init,
    client_update=client_update,
    server_update=server_update,
    round_diagnostics=round_diagnostics,
)
