"""FedCAC (Wu et al., ICCV 2023, "Bold but Cautious"): per-client critical
parameters; non-critical ones are averaged over all clients, critical ones only
over the clients whose critical sets overlap enough.

Round t, each selected client i (kernels in fedjax_pfl/kernels/critical_params.py):
1. Starts from its personalized model theta_i (below; the initial model before
   it has ever trained) and trains E epochs of CE on the whole model.
2. Sensitivity s = |(theta_trained - theta_start) * theta_trained| and the
   critical mask c_i: per parameter tensor the tau fraction with the largest s.
3. Uploads theta_trained and c_i.
Server, after the round:
4. Global model g = average of the uploads with weights n_i (FedAvg).
5. Overlap o_ij = 1 - |c_i - c_j|_1 / (2 |c_i|_1) between all clients that
   have a mask; threshold T_t = mean + (t + 1) / beta * (max - mean) of the
   off-diagonal overlaps (bold early, cautious late).
6. Customized model u_i = unweighted mean of theta_j over {i} and the j with
   o_ij >= T_t; personalized model theta_i = c_i * u_i + (1 - c_i) * g, for
   EVERY client (all N rows in one matmul).
Evaluation protocol: each client's personalized theta_i of step 6, i.e. the
model it holds after aggregation, before its next local training (the
authors' ``test_place='after_aggregation'``); before the first round, the
initial model.

Where this library follows the authors' code (FLAIR-Community/Fling,
``fedcac_client`` / ``fedcac_group``) over the paper's text:
- Sensitivity uses the local update instead of the gradient of |g * theta|;
  ``method.sensitivity=gradient`` takes the gradient of the mean CE over the
  client's train data at the trained parameters instead.
- The threshold factor is (t + 1) / beta with t the 0-based round just
  trained (Fling's group epoch counter; PFLlib's port lags one round).
- The customized average is unweighted; the global one is weighted by n_i.
- BatchNorm statistics (if any) stay with each client (the masks and the
  merge cover trainable parameters only, as the code's ``named_parameters``).
Partial participation (the authors' runs use every client every round): the
server keeps each client's latest uploaded model and mask; clients that have
not trained yet take no part in the overlaps and hold the global model.
With tau = 0 nothing is critical and the method is exactly FedAvg (tested).
Diagnostics (`round_diagnostics`): the selected clients' self-weight in the
customized mix of step 6 (1 / (1 + collaborators)) and its mass on the
collaborators (the non-critical parameters are FedAvg's global model in any
case), and the distances of the stored models.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_pfl import aggregation, losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels import collaboration, critical_params, model_store
from fedjax_pfl.methods import training
from fedjax_pfl.methods.base import Algorithm, LocalTraining, Paper
from fedjax_pfl.methods.options import Options, option

SENSITIVITIES = ("update", "gradient")


@dataclasses.dataclass(frozen=True)
class FedCACConfig(Options):
    tau: float = option(0.5, "critical ratio: fraction of each parameter tensor marked critical", at_least=0.0,
                        at_most=1.0)
    beta: float = option(100.0, "threshold schedule length in rounds (bold early, cautious late; 100: the authors' "
                         "Fling config for CIFAR-10)", more_than=0.0)
    sensitivity: str = option("update", "sensitivity from the local update (authors' code) or the gradient "
                              "(paper)", choices=SENSITIVITIES)


def init(m, key, num_clients):
    """The global model, every client's stored model and personalized model, no masks yet."""
    variables = m.model.init(key)
    params = variables["params"]
    stacked = lambda: jax.tree.map(lambda a: jnp.tile(a, (num_clients,) + (1,) * a.ndim), params)  # noqa: E731
    server = {
        "global": params,
        "models": stacked(),  # latest uploaded trained model of every client
        "masks": jax.tree.map(lambda a: jnp.zeros((num_clients,) + a.shape, bool), params),
        "active": jnp.zeros(num_clients, bool),  # has uploaded a mask
        "personalized": stacked(),  # theta_i of step 6, what client i starts from
    }
    clients = {"index": jnp.arange(num_clients, dtype=jnp.int32)}
    if "batch_stats" in variables:
        clients["batch_stats"] = tree_ops.broadcast(variables["batch_stats"], num_clients)
    return server, clients


def personalized(m, server, client):
    """Client i's variables: its row of server['personalized'] and its own BatchNorm statistics."""
    variables = {"params": tree_ops.gather(server["personalized"], client["index"])}
    if "batch_stats" in client:
        variables["batch_stats"] = client["batch_stats"]
    return variables


def mean_gradient(m, local: LocalTraining, variables, data):
    """Gradient of the mean CE over the client's train samples w.r.t. its parameters (batches of
    ``local.batch_size``)."""

    def batch_gradient(batch):
        def loss(params):
            logits = m.model.apply({**variables, "params": params}, batch.x, train=False).logits
            return losses.cross_entropy(logits, batch.y, batch.mask) * jnp.sum(batch.mask)

        return jax.grad(loss)(variables["params"])

    summed = training.sum_batches(local, batch_gradient, data)
    return tree_ops.scale(summed, 1.0 / jnp.maximum(data.n, 1))


def critical(m, local: LocalTraining, start, trained, data):
    """Step 2: the client's critical mask (tree of bools) after local training."""
    hp = m.hparams
    if hp.sensitivity == "gradient":
        s = critical_params.gradient_sensitivity(trained["params"], mean_gradient(m, local, trained, data))
    else:
        s = critical_params.sensitivity(trained["params"], start["params"])
    return critical_params.critical_masks(s, hp.tau)


def client_update(m, server, client, data, key, info):
    """Steps 1-3: E epochs from theta_i; upload the trained model and its critical mask."""
    local = m.local
    start = personalized(m, server, client)
    trained, loss = training.train(local, training.supervised_objective(m), start, data, key, info.epochs)
    new_client = {**client, **({"batch_stats": trained["batch_stats"]} if "batch_stats" in client else {})}
    upload = {"params": trained["params"], "mask": critical(m, local, start, trained, data), "loss": loss}
    return new_client, upload


def collaboration_weights(m, masks, active, round_index):
    """W [N, N] of step 6: row i uniform over {i} and its collaborators of this round."""
    overlap = critical_params.overlap_rates(masks)
    threshold = critical_params.collaboration_threshold(overlap, active, round_index, m.hparams.beta)
    return critical_params.collaboration_weights(overlap, active, threshold)


def server_update(m, server, clients, uploads, info):
    """Steps 4-6: the global model, the stored models and masks, every client's personalized model."""
    global_params = aggregation.weighted_mean_or(uploads["params"], info.sample_weights, server["global"])
    store = lambda old, new: model_store.store_arrived(old, info.selected, info.uploaded, new)  # noqa: E731
    models = store(server["models"], uploads["params"])
    masks = store(server["masks"], uploads["mask"])
    active = store(server["active"], info.uploaded)
    weights = collaboration_weights(m, masks, active, info.round)
    customized = critical_params.customized_models(weights, models)
    merged = critical_params.merge(masks, customized, global_params)
    server = {"global": global_params, "models": models, "masks": masks, "active": active, "personalized": merged}
    return server, clients


def round_diagnostics(m, server, new_server, uploads, info):
    """The selected clients' rows of W (the critical parameters' mix) and the stored models' distances."""
    weights = collaboration_weights(m, new_server["masks"], new_server["active"], info.round)
    return {**collaboration.weight_summary(weights[info.selected], info.selected),
            **collaboration.distance_summary(new_server["models"])}


def eval_variables(m, server, client, data, key):
    """The personalized theta_i of step 6."""
    return personalized(m, server, client)


FEDCAC = Algorithm(
    name="fedcac",
    paper=Paper("FedCAC", authors="Xinghao Wu, Xuefeng Liu, Jianwei Niu, Guogang Zhu, Shaojie Tang",
                title="Bold but Cautious: Unlocking the Potential of Personalized Federated Learning through "
                "Cautiously Aggressive Collaboration", venue="ICCV", year=2023, url="https://arxiv.org/abs/2309.11103",
                code="FLAIR-Community/Fling"),
    hparams_type=FedCACConfig,
    init=init,
    client_update=client_update,
    server_update=server_update,
    eval_variables=eval_variables,
    round_diagnostics=round_diagnostics,
)
