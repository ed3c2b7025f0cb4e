"""FedFomo (Zhang et al., ICLR 2021): personalized first-order model combinations.

Each client keeps its own model; the server keeps every client's latest upload
(`model_store`) and which clients uploaded last round. A selected client i:
1. picks M other clients epsilon-greedily from its affinity row P_i (highest
   affinity first, a random one with probability eps_t = max(eps - t * decay, 0))
   among last round's uploaders (`fomo_weights.egreedy_select`);
2. on its validation split compares the baseline theta_b (its model at the
   start of its previous local training, the authors' ``first_model``) with
   the M received models and its own latest model:
       w_m = max((L(theta_b) - L(theta_m)) / ||theta_m - theta_b||, 0), normalised,
       theta = theta_b + sum_m w_m (theta_m - theta_b)
   (`fomo_weights`), so it never moves toward a model that is worse than the
   baseline on its validation data; if none is better (every weight 0) it
   keeps its latest model (``no_gain='latest'``, PFLlib's clientfomo: the
   weighted sum is skipped and the client trains on from the model it holds),
   so the baseline of the next round, the start of this round's training,
   moves with it; ``no_gain='baseline'`` restarts from theta_b instead (the
   formula with all w_m = 0, and the authors' code, whose client then takes
   its first model), which leaves theta_b where it was round after round
   once no candidate beats it: the client retrains the same model. The
   default is PFLlib's because with E local epochs on a few hundred samples
   the client's own latest model often loses to theta_b on validation, so
   that under the baseline rule most clients stop learning after a few rounds;
3. adds raw / |sum raw| to P_i at the models it evaluated (the authors' code);
4. trains theta E epochs on its train part and uploads the result.
Round 0 has nothing to download (as the authors' first round: local training only).

Selection (``selection``): ``egreedy`` (the authors', above), or ``top_m``,
PFLlib's FedFomo (serverfomo.py), which the DiversiFed paper ran: the
client evaluates the models of the ``num_received + 1`` highest entries of
its affinity row over all clients, itself included (its own latest model
when it is among them), once last round's uploads arrived (as many as
arrived, at most that many); the row starts as the identity (self 1, others
0) and grows by the raw weights of the models evaluated.

Validation split: ``val_fraction`` (default 0.2, the authors' ``--train_split
0.8``) of each client's OWN train samples, deterministic and evenly spaced
(`validation_split`); it is never trained on. Test data is never touched.
A client with fewer than 1 / val_fraction samples has no validation sample:
all its weights are 0 and every round it trains on from its latest model
(from theta_b with ``no_gain='baseline'``).

Choices from the authors' code (NVlabs/FedFomo, the README commands behind the
published numbers), where the paper is silent or differs:
  - the client's own latest model is one of the evaluated models, and the
    baseline is the model before its last local training (``--baseline_model
    first_model``);
  - distance: L1 norm of the parameter difference (``--model_delta_norm``
    default 'l1'); the paper's Euclidean norm is ``method.norm=l2``;
  - M = 4 received models plus the own one (the "5 models" command),
    epsilon 0.3, decay 0.05 per round; affinity starts at 0 (self 0.1);
  - candidates are last round's uploaders (the server's ``uploaded_clients``);
  - the distance covers trainable parameters; the update moves all variables
    (BatchNorm statistics too, as the authors' state_dict update).
The server's averages: the authors' server also offers every client its
global model and the averages of 5 "sub-federations" (``-nf 5`` in their
README commands) as extra candidates, weighed like any candidate but, as in
their code with the first-model baseline, adding nothing to the affinity row.
``method.num_federations=k`` does that (kernels/sub_federations.py): after
each round the server clusters all clients into k groups by spectral
clustering of the symmetrised softmax of their affinity rows (which clients
upload with their model), averages each group's members of its latest round
(weighted by train size), and offers the k averages and their mean. The
clustering's start row is drawn once per run, as their fixed
``random_state``. ``method.offer_average=true`` offers one model instead:
the mean of last round's arrived uploads weighted by train size (the
authors' global model when there is one federation). The default (neither)
is the paper's flat update over client models only, which the tables here
ran.

Evaluation protocol: each client's own model after its local training (the
authors evaluate ``client.model``); a client never selected keeps the initial model.

Diagnostics (`round_diagnostics`): the selected clients' mean weight on
their own models (1 when every weight is 0: they keep their own), the mass
on the others' and the server averages, the share whose weights were all 0,
and the distances of the server's stored models.

The DiversiFed tables (configs/tables/diversifed_table*.yaml) set PFLlib's
FedFomo: ``selection=top_m norm=l2``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_pfl import aggregation, losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels import collaboration, fomo_weights, model_store, spectral_clustering, sub_federations
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods import training
from fedjax_pfl.methods.base import Algorithm, LocalTraining, Paper, RunFacts
from fedjax_pfl.data.validation_split import split_train_validation
from fedjax_pfl.methods.options import Options, option

SELF_AFFINITY = 0.1  # the authors' --client_initial_self_weight
TOP_M_SELF_AFFINITY = 1.0  # PFLlib's P = identity
NO_GAIN = ("latest", "baseline")
SELECTIONS = ("egreedy", "top_m")


@dataclasses.dataclass(frozen=True)
class FedFomoConfig(Options):
    num_received: int = option(4, "M other clients' models downloaded per round (plus the client's own)",
                               at_least=1)
    epsilon: float = option(0.3, "initial probability of a random (not highest-affinity) pick", at_least=0.0,
                            at_most=1.0)
    epsilon_decay: float = option(0.05, "decrease of epsilon per round", at_least=0.0, at_most=1.0)
    val_fraction: float = option(0.2, "fraction of each client's own train samples held out for validation",
                                 more_than=0.0, less_than=1.0)
    norm: str = option("l1", "norm of the parameter difference in the weights (l1: authors' code, l2: paper)",
                       choices=fomo_weights.NORMS)
    no_gain: str = option("latest", "when every weight is 0: keep the latest model, the baseline moving to it "
                          "(PFLlib), or restart from the baseline", choices=NO_GAIN)
    selection: str = option("egreedy", "candidates: epsilon-greedy over last round's uploaders (authors) or the "
                            "num_received + 1 highest affinities, own included (PFLlib)", choices=SELECTIONS)
    offer_average: bool = option(False, "also offer the train-size-weighted mean of last round's uploads "
                                        "(the authors' global model; no affinity for it)")
    num_federations: int = option(0, "k > 0: also offer the averages of k sub-federations (spectral clusters of "
                                     "the affinity matrix) and their mean, as the authors' -nf k", at_least=0)

    def check(self) -> None:
        if self.offer_average and self.num_federations:
            raise UserError("method.offer_average and method.num_federations both add the server's averages; "
                            "set one (num_federations=k offers k sub-federation averages and their mean)")


def _prepend(single, stacked):
    """A tree [1 + M, ...]: ``single`` as row 0, then the rows of ``stacked`` [M, ...]."""
    return _concat(jax.tree.map(lambda a: a[None], single), stacked)


def _concat(first, second):
    """A tree [M + K, ...]: the rows of ``first`` [M, ...], then those of ``second`` [K, ...]."""
    return jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=0), first, second)


def self_affinity(m) -> float:
    """The initial affinity of a client to itself (the authors' 0.1; PFLlib's identity for top_m)."""
    return TOP_M_SELF_AFFINITY if m.hparams.selection == "top_m" else SELF_AFFINITY


def init(m, key, num_clients):
    """Every client from one model; the server stores every client's model; affinities start on the diagonal."""
    _, clients = training.shared_init(m, key, num_clients)
    copy = lambda tree: jax.tree.map(jnp.copy, tree)  # noqa: E731  distinct buffers: the engine donates state
    affinity = self_affinity(m) * jnp.eye(num_clients, dtype=jnp.float32)
    server = {"models": copy(clients), "available": jnp.zeros((num_clients,), bool)}
    if m.hparams.offer_average:  # valid once a round's uploads arrived
        server["average"] = jax.tree.map(lambda a: jnp.copy(a[0]), clients)
    if m.hparams.num_federations:
        server.update(federations_init(m, key, clients, num_clients))
    return server, {"variables": clients, "first": copy(clients), "affinity": affinity,
                    "index": jnp.arange(num_clients, dtype=jnp.int32)}


def check(name, options, facts: RunFacts) -> None:
    """Fewer sub-federations than clients."""
    k = options.num_federations
    if k and facts.num_clients is not None and k >= facts.num_clients:
        raise UserError(f"method.num_federations={k} needs more clients than sub-federations "
                        f"({facts.num_clients} clients); lower it")


def federations_init(m, key, clients, num_clients):
    """Server state of the sub-federations: every client's affinity row, last upload round and size."""
    k = m.hparams.num_federations
    return {"affinity": self_affinity(m) * jnp.eye(num_clients, dtype=jnp.float32),
            "last_round": jnp.full((num_clients,), -1, jnp.int32),
            "sizes": jnp.zeros((num_clients,), jnp.float32),
            "cluster_start": jax.random.randint(jax.random.fold_in(key, 1), (), 0, num_clients),
            "federations": jax.tree.map(lambda a: jnp.zeros((k + 1,) + a.shape[1:], a.dtype), clients),
            "federations_valid": jnp.zeros((k + 1,), bool)}


def federations_update(m, server, info, affinity_rows):
    """The server's new sub-federation state after this round's uploads (module docstring)."""
    k = m.hparams.num_federations
    store = lambda old, new: model_store.store_arrived(old, info.selected, info.uploaded, new)
    affinity = store(server["affinity"], affinity_rows)
    last_round = store(server["last_round"], jnp.full(info.selected.shape, info.round, jnp.int32))
    sizes = store(server["sizes"], info.num_samples)
    embedding = spectral_clustering.spectral_embedding(sub_federations.affinity_graph(affinity), k)
    labels = spectral_clustering.discretize_from(embedding, server["cluster_start"])
    weights, valid = sub_federations.cluster_weights(labels, last_round, sizes, k)
    return {"affinity": affinity, "last_round": last_round, "sizes": sizes,
            "cluster_start": server["cluster_start"],
            "federations": sub_federations.federation_models(server["models"], weights, valid),
            "federations_valid": jnp.concatenate([valid, jnp.any(valid)[None]])}


def validation_loss(m, local: LocalTraining, variables, data):
    """Mean CE of ``variables`` over the real samples of ``data`` (batches of ``local.batch_size``)."""

    def batch_sums(batch):
        logits = m.model.apply(variables, batch.x, train=False).logits
        count = jnp.sum(batch.mask.astype(jnp.float32))
        return losses.cross_entropy(logits, batch.y, batch.mask) * count, count

    nll, count = training.map_batches(local, batch_sums, data)  # fixed length: differentiable (tests take its gradient)
    return jnp.sum(nll) / jnp.maximum(jnp.sum(count), 1.0)


def client_candidates(m, server, client, key, round_index):
    """Step 1 -> (models [M, ...], their client ids [M], valid [M], is_own [M])."""
    hp = m.hparams
    index, affinity = client["index"], client["affinity"]
    own_model = jax.tree.map(lambda a: a[None], client["variables"])
    if hp.selection == "top_m":
        count = min(hp.num_received + 1, affinity.shape[0])
        ids = fomo_weights.top_m_select(key, affinity, count)
        is_own = ids == index
        models = jax.tree.map(lambda stored, own: jnp.where(is_own.reshape((-1,) + (1,) * (own.ndim - 1)),
                                                            own, stored),
                              tree_ops.gather(server["models"], ids), own_model)
        return models, ids, jnp.arange(count) < jnp.sum(server["available"]), is_own
    count = min(hp.num_received, affinity.shape[0] - 1)
    if count == 0:  # a single client: only its own model
        return own_model, index[None], jnp.ones(1, bool), jnp.ones(1, bool)
    available = server["available"].at[index].set(False)
    eps = fomo_weights.exploration_rate(round_index, hp.epsilon, hp.epsilon_decay)
    others, valid = fomo_weights.egreedy_select(key, affinity, available, count, eps)
    is_own = jnp.arange(count + 1) == 0
    return (_prepend(client["variables"], tree_ops.gather(server["models"], others)),
            jnp.concatenate([index[None], others]), jnp.concatenate([jnp.ones(1, bool), valid]), is_own)


def federated_start(m, local: LocalTraining, server, client, validation, key, round_index):
    """Steps 1-3 -> (the model to train from this round, the new affinity row, the client's
    collaboration: weight on its own models and on the others', whether all weights were 0); validation
    losses in batches of ``local.batch_size``."""
    hp = m.hparams
    candidates, ids, clients_valid, is_own = client_candidates(m, server, client, key, round_index)
    valid = clients_valid
    extra = []  # server averages after the clients' models; they have no affinity entries
    if hp.offer_average:
        extra.append((jax.tree.map(lambda a: a[None], server["average"]), jnp.any(server["available"])[None]))
    if hp.num_federations:  # k sub-federation averages and their mean
        extra.append((server["federations"], server["federations_valid"]))
    for models, ok in extra:
        candidates, valid = _concat(candidates, models), jnp.concatenate([valid, ok])
        is_own = jnp.concatenate([is_own, jnp.zeros(ok.shape, bool)])
    base = client["first"]
    val_losses = jax.vmap(lambda v: validation_loss(m, local, v, validation))(_prepend(base, candidates))
    distances = jax.vmap(lambda c: fomo_weights.parameter_distance(c, base["params"], hp.norm))(candidates["params"])
    raw = fomo_weights.raw_weights(val_losses[0], val_losses[1:], distances, valid)
    weights = fomo_weights.positive_weights(raw)
    start = fomo_weights.apply_weights(base, candidates, weights)
    no_gain = ~jnp.any(weights > 0)
    if hp.no_gain == "latest":
        start = tree_ops.select(no_gain, client["variables"], start)
    increment = raw if hp.selection == "top_m" else fomo_weights.affinity_increment(raw)  # over all candidates
    affinity = client["affinity"].at[ids].add(jnp.where(clients_valid, increment[:ids.shape[0]], 0.0))
    shares = collaboration.own_and_others(weights, is_own)
    shares = {**shares, "self_weight": jnp.where(no_gain, 1.0, shares["self_weight"]), "all_zero_share": no_gain}
    return start, affinity, shares


def client_update(m, server, client, data, key, info):
    """Steps 1-4: hold out validation data, weight the downloaded models into the start, train E epochs on the
    rest, upload the trained model (and the affinity row, for the sub-federations)."""
    k_select, k_train = jax.random.split(key)
    train_part, validation = split_train_validation(data, m.hparams.val_fraction)
    local = m.local
    start, affinity, shares = federated_start(m, local, server, client, validation, k_select, info.round)
    variables, loss = training.train(local, training.supervised_objective(m), start, train_part, k_train,
                                     info.epochs)
    client = {**client, "variables": variables, "first": start, "affinity": affinity}
    upload = {"variables": variables, "loss": loss, "collaboration": shares}
    if m.hparams.num_federations:  # the server clusters every client's affinity row
        upload["affinity"] = affinity
    return client, upload


def round_diagnostics(m, server, new_server, uploads, info):
    """The selected clients' weights on their own and the others' models; the stored models' distances."""
    return {**collaboration.client_means(uploads["collaboration"]),
            **collaboration.distance_summary(server["models"]["params"])}


def server_update(m, server, clients, uploads, info):
    """Store the arrived models (and the average or the sub-federations' averages that are offered)."""
    models = model_store.store_arrived(server["models"], info.selected, info.uploaded, uploads["variables"])
    available = model_store.arrived_mask(server["available"].shape[0], info.selected, info.uploaded)
    new = {"models": models, "available": available}
    if m.hparams.offer_average:
        new["average"] = aggregation.weighted_mean_or(uploads["variables"], info.sample_weights,
                                                      server["average"])
    if m.hparams.num_federations:
        new.update(federations_update(m, {**server, **new}, info, uploads["affinity"]))
    return new, clients


FEDFOMO = Algorithm(
    name="fedfomo",
    paper=Paper("FedFomo", authors="Michael Zhang, Karan Sapra, Sanja Fidler, Serena Yeung, Jose M. Alvarez",
                title="Personalized Federated Learning with First Order Model Optimization", venue="ICLR", year=2021,
                url="https://arxiv.org/abs/2012.08565", code="NVlabs/FedFomo"),
    hparams_type=FedFomoConfig,
    check=check,
    init=init,
    client_update=client_update,
    server_update=server_update,
    round_diagnostics=round_diagnostics,
)
