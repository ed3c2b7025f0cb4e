"""FedAS (Yang et al., CVPR 2024): parameter alignment and Fisher-weighted
client synchronization, on top of the shared-body shape (body shared, head private).

Round t, for each selected client i (docs/methods/conventions.md, "FedAS"):

1. Parameter alignment (``align``; skipped in round 0, ``info.round == 0``).
   The client's previous local body f_old (its stored variables, frozen, in
   inference mode) gives class means mu_c of its features over the client's
   train samples. The client's own copy of the received global body is then
   trained on the alignment loss only (``losses.class_mean_alignment``; with
   ``alignment='per_sample'``, ``losses.sample_alignment`` to f_old(x) of the
   same sample, the paper text's reading) for ``align_epochs`` epochs, batch
   ``align_batch_size``, plain SGD lr ``align_lr`` (optax.sgd; its own
   optimizer, separate from local training's). Body only; the client keeps
   its head. A client never selected before aligns to the initial body it
   still holds, as in the authors' code where such a client's model is its
   initial copy.
2. Local training: E epochs (``info.epochs``: stragglers train fewer) of CE
   on body + head with the run's optimizer.
3. Fisher trace of the trained model (inference mode, parameters of body and
   head, true labels, the client's train batches in order with batch size B):
   ``fisher='batch'`` (default, authors' code) or ``'per_sample'``
   (fedjax_pfl.kernels.fisher). Only with ``fisher_weights`` (the trace is
   the aggregation weight; n_i weights need none).
4. Server: alpha_i = F_i / sum over uploaded j of F_j
   (``aggregation.fisher_weights``; dropped uploads weigh 0), new global body
   = sum_i alpha_i body_i. ``fisher_weights=False``: n_i weights (FedPer's).
   Heads stay private.

Straggler simulation is the engine's (train.straggler_fraction: a fraction of
the selected clients trains 1..E//2 epochs; train.drop_fraction: uploads
lost; train.join_ratio: the online ratio P). Alignment always runs its full
``align_epochs``; only local training is shortened for stragglers.

On the weights (measured, tests/test_fedas.py): the paper says a client that
trained less gets a lower Fisher weight. That holds early in training, while
the weights grow out of a small init and the squared gradients grow with them;
once the model fits the client's data, more local training lowers the
empirical Fisher trace and a straggler gets the LARGER weight. The rule is
implemented as specified either way.

Evaluation (``eval.model``): ``local`` by default, each client's model after
its own last training. The authors' code (a PFLlib fork) evaluates after
sending the global body (and aligning it) to the round's selected clients
only, so unselected clients are evaluated with their local model there too;
``global`` evaluates every client with the global body and its own head.

Where the spec is silent (authors' code followed): class means use the old
model in eval mode over the client's train batches; the alignment trains the
body in train mode (BatchNorm statistics update with it); the Fisher pass uses
the local batch size, the batches in storage order, the last batch partial.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl import aggregation, losses
from fedjax_pfl.kernels import fisher, local_training
from fedjax_pfl.methods import shared_body, training
from fedjax_pfl.methods.base import Algorithm, LocalTraining, Paper
from fedjax_pfl.methods.options import Options, option

ALIGNMENTS = ("class_mean", "per_sample")


@dataclasses.dataclass(frozen=True)
class FedASConfig(Options):
    """FedAS options (``method.<field>=value``)."""

    align: bool = option(True, "parameter alignment of the received body before local training (false: FedPer-like)")
    fisher_weights: bool = option(True, "Fisher-trace aggregation weights (false: n_i)")
    fisher: str = option("batch", "Fisher trace from squared batch gradients (authors' code) or per-sample "
                         "(textbook empirical Fisher)", choices=fisher.FORMS)
    alignment: str = option("class_mean", "align each sample to its class mean (authors' code) or to the old "
                            "body's feature of the same sample (paper text)", choices=ALIGNMENTS)
    align_epochs: int = option(1, "epochs of the alignment phase", at_least=1)
    align_batch_size: int = option(16, "batch size of the alignment phase", at_least=1)
    align_lr: float = option(0.01, "plain-SGD step size of the alignment phase", more_than=0.0)


# ---- step 1: parameter alignment -----------------------------------------------------------


def features(m, variables, x, train: bool = False):
    return m.model.apply(variables, x, train=train).features


def class_means(m, local: LocalTraining, variables, data):
    """[C, d] mean feature of each class over the client's real train samples under ``variables`` (inference
    mode, batches of ``local.batch_size``); zero rows for absent classes."""
    num_classes = m.model.num_classes

    def batch_sums(batch):
        f = features(m, variables, batch.x).astype(jnp.float32)
        onehot = jax.nn.one_hot(batch.y, num_classes) * batch.mask[:, None]
        return onehot.T @ f, onehot.sum(axis=0)

    sums, counts = training.sum_batches(local, batch_sums, data)
    return sums / jnp.maximum(counts, 1.0)[:, None]


def alignment_objective(m, local: LocalTraining, old_variables, data):
    """objective(variables, batch, key) -> (alignment loss, batch_stats)."""
    old_variables = jax.lax.stop_gradient(old_variables)
    if m.hparams.alignment == "class_mean":
        means = class_means(m, local, old_variables, data)

        def target_loss(feats, batch):
            return losses.class_mean_alignment(feats, batch.y, means, batch.mask)
    else:

        def target_loss(feats, batch):
            targets = jax.lax.stop_gradient(features(m, old_variables, batch.x))
            return losses.sample_alignment(feats, targets, batch.mask)

    def objective(variables, batch, key):
        out = m.model.apply(variables, batch.x, train=True, mask=batch.mask)
        return target_loss(out.features, batch), out.batch_stats

    return objective


FEATURE_CHANGE_SAMPLES = 256  # the diagnostic's sample: two inference passes over all data cost ~10% of a round


def feature_change(m, local: LocalTraining, before, after, data):
    """Mean over the client's first (at most `FEATURE_CHANGE_SAMPLES`) train samples of
    ||f_after(x) - f_before(x)||^2 (inference mode, one batch): how far the alignment moved the received body's
    features. A diagnostic, not part of the method: measured on a sample so that it costs a fraction of one
    inference pass instead of two whole ones."""
    sample = data._replace(n=jnp.minimum(data.n, FEATURE_CHANGE_SAMPLES))

    def batch_sum(batch):
        delta = features(m, after, batch.x) - features(m, before, batch.x)
        return jnp.sum(jnp.sum(delta.astype(jnp.float32) ** 2, axis=-1) * batch.mask)

    total = local_training.sum_batches(batch_sum, sample, FEATURE_CHANGE_SAMPLES, local.normalize,
                                         local.loops)
    return total / jnp.maximum(sample.n.astype(jnp.float32), 1.0)


def align(m, local: LocalTraining, old_variables, variables, data, key):
    """Train the body of ``variables`` on the alignment loss -> (variables, mean loss): local training with the
    alignment's own optimizer, batch size and epochs (``local``'s normalisation, augmentation and drop_last)."""
    hp = m.hparams
    alignment = dataclasses.replace(local, optimizer=optax.sgd(hp.align_lr), batch_size=hp.align_batch_size,
                                    local_epochs=hp.align_epochs)
    return training.train(alignment, alignment_objective(m, local, old_variables, data), variables, data, key,
                          hp.align_epochs, part="body")


def aligned_after_round_zero(m, local: LocalTraining, client, received, data, key, round_index):
    """-> (received body aligned to the client's previous one, alignment loss, feature change); from round 1
    on. ``lax.cond``: the round index is the same for every client (not vmapped), so round 0 skips the
    alignment's compute, not just its result."""

    def aligned(received):
        out, loss = align(m, local, client["variables"], received, data, key)
        return out, loss, feature_change(m, local, received, out, data)

    zero = jnp.zeros((), jnp.float32)
    return jax.lax.cond(round_index > 0, aligned, lambda v: (v, zero, zero), received)


# ---- step 3: Fisher trace ------------------------------------------------------------------


def fisher_trace(m, local: LocalTraining, variables, data):
    """The client's Fisher trace over its train batches (batch size B = ``local.batch_size``, in order),
    parameters of body and head in inference mode (BatchNorm statistics held fixed)."""

    def logits_fn(params, x):
        return m.model.apply({**variables, "params": params}, x, train=False).logits

    params = variables["params"]
    if m.hparams.fisher == "batch":
        return training.sum_batches(
            local, lambda b: fisher.batch_gradient_sq_norm(logits_fn, params, b.x, b.y, b.mask), data)
    total = training.sum_batches(
        local, lambda b: fisher.per_sample_gradient_sq_norm_sum(logits_fn, params, b.x, b.y, b.mask), data)
    return total / jnp.maximum(data.n.astype(jnp.float32), 1.0)


# ---- the client round: steps 1-3 ----------------------------------------------------------


def client_update(m, server, client, data, key, info):
    """Receive the global body, align it (from round 1), train E epochs, upload the body and the Fisher trace.
    Local training uses the round key itself (as FedPer), so align=False reproduces FedPer's training
    exactly; the alignment gets a derived key."""
    local = m.local
    variables = shared_body.receive(m, server, client)
    extras = {}
    if m.hparams.align:
        variables, extras["align_loss"], extras["feature_change"] = aligned_after_round_zero(
            m, local, client, variables, data, jax.random.fold_in(key, 1), info.round)
    variables, loss = training.train(local, training.supervised_objective(m), variables, data, key, info.epochs)
    if m.hparams.fisher_weights:  # (n_i weights need no trace: its pass would cost about an epoch)
        extras["fisher"] = fisher_trace(m, local, variables, data)
    return shared_body.upload(local, client, variables, loss, extras=extras)


# ---- step 4: server --------------------------------------------------------------------


def aggregation_weights(m, uploads, info):
    """alpha_i before normalisation: the Fisher traces of the arrived uploads, or n_i."""
    if m.hparams.fisher_weights:
        return aggregation.fisher_weights(uploads["fisher"], info.uploaded)
    return info.sample_weights


def server_update(m, server, clients, uploads, info):
    """The new global body: sum_i alpha_i body_i."""
    return shared_body.average(m, server, uploads, aggregation_weights(m, uploads, info)), clients


def round_diagnostics(m, server, new_server, uploads, info):
    """Per selected client: ``weight``, its normalised aggregation weight alpha_i (the Fisher weights, or
    n_i / sum n_j with fisher_weights=False; 0 for a dropped upload), ``fisher``, its Fisher trace F_i (0 with
    fisher_weights=False: not computed), ``feature_change``, how far the alignment moved the received body's
    features (`feature_change`), and ``align_loss``, the alignment's mean loss (both 0 without the alignment,
    and in round 0)."""
    weights = aggregation.normalize_weights(aggregation_weights(m, uploads, info))
    zeros = jnp.zeros_like(weights)
    change, align_loss = (uploads["feature_change"], uploads["align_loss"]) if m.hparams.align else (zeros, zeros)
    return {"weight": weights, "fisher": uploads["fisher"] if m.hparams.fisher_weights else zeros,
            "feature_change": change, "feature_change_mean": jnp.mean(change), "align_loss": align_loss}


FEDAS = Algorithm(
    name="fedas",
    paper=Paper("FedAS", authors="Xiyuan Yang, Wenke Huang, Mang Ye",
                title="FedAS: Bridging Inconsistency in Personalized Federated Learning", venue="CVPR", year=2024,
                url="https://openaccess.thecvf.com/content/CVPR2024/html/Yang_FedAS_Bridging_Inconsistency_in_"
                    "Personalized_Federated_Learning_CVPR_2024_paper.html",
                code="xiyuanyang45/FedAS"),
    hparams_type=FedASConfig,
    eval_models=("local", "global"),
    needs_body_head_split=True,
    init=shared_body.init,
    client_update=client_update,
    server_update=server_update,
    eval_variables=shared_body.eval_variables,
    round_diagnostics=round_diagnostics,
)
