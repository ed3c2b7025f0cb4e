"""PFAKD: personalized FL with feature alignment by knowledge distillation.

Algorithm (docs/methods/conventions.md, "PFAKD"), per selected client i in round t:
  1. take the received global body f_G into the local model (own head h_i kept)
     and keep a frozen copy of it as the teacher f_T = f_G;
  2. train body and head E epochs on
       CE(h_i(f_i(x)), y) + beta * mean_{batch, d} (f_i(x) - f_T(x))^2,
     each sample matched to its own teacher feature (`losses.feature_distillation`);
  3. upload the body. The server averages bodies with weights n_i (the
     shared_body.average); heads stay private; nothing else is uploaded.

The teacher is the body only: its features are ``model.apply(teacher, x).features``
where ``teacher`` holds the received global body (the head in the same
variables never enters the features). It is a constant of the round, closed
over by the objective behind ``stop_gradient``: it takes no gradient and never
changes between local steps. With ``beta = 0`` the method is FedPer.

``pfakd_at`` adds attention transfer (`losses.attention_transfer`) between the
local and teacher intermediate conv maps (``ModelOutput.maps``):
``gamma * 0.5 * ||Q_local - Q_teacher||_2`` per chosen map, batch-averaged.
"PFAKD+AT" is named but not defined in the paper's text; this is this
library's reading of it (docs/methods/conventions.md), with the layers (``at_layers``, indices
into ``ModelOutput.maps``, default all) and the weight (``gamma``) as options.
The paper gives no gamma; the default 1.0 puts the AT term on the scale of the
beta = 1 feature term. With ``gamma = 0`` pfakd_at equals pfakd.

From the authors' code (fei0829/PFAKD, a PFLlib fork), where docs/methods/conventions.md is
silent: the teacher is a deep copy of the received global body that is never
put in eval mode, so with BatchNorm (ResNet-18) it normalises with the batch's
statistics (``teacher_train_mode=True``, the default; False applies it with the
received running statistics, as a PyTorch teacher in ``eval()``). Its features
enter the MSE as they are; no gradient reaches it (only the student's
parameters are in the optimizer). That code also copies and averages
parameters only, so BatchNorm running statistics stay local: set
``train.share_batch_stats=false`` to match. Its learning-rate decay (0.9 per
local round), its momentum buffer kept across rounds and its drop_last batches
apply to every method there; here they are the run options
``train.lr_decay=0.9``, ``train.persistent_optimizer=true`` (one optimizer
state per client over the whole model it trains, received body included, as
its PFLlib clients keep their optimizer object) and ``train.drop_last=true``.

Evaluation (``eval.model``): ``global`` by default, as the authors' code
(a PFLlib fork), which evaluates after the server sends the new global body:
each client's own head on the current global body; ``local`` evaluates the
body the client distilled itself in its last round.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_pfl import losses
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods import shared_body, training
from fedjax_pfl.methods.base import Algorithm, Paper, RunFacts
from fedjax_pfl.methods.options import Options, option


@dataclasses.dataclass(frozen=True)
class PFAKDConfig(Options):
    beta: float = option(1.0, "weight of the per-sample feature MSE to the frozen global body", at_least=0.0)
    teacher_train_mode: bool = option(True, "BatchNorm only: the teacher runs on batch statistics (authors' "
                                      "code); false: on the received running statistics")


def _some_layers(layers) -> None:
    if not layers:
        raise UserError("method.at_layers lists no conv map; leave it unset for all of them, or use "
                        "--method pfakd for no attention transfer")


@dataclasses.dataclass(frozen=True)
class PFAKDATConfig(PFAKDConfig):
    gamma: float = option(1.0, "weight of attention transfer between local and teacher conv maps", at_least=0.0)
    at_layers: tuple[int, ...] | None = option(None, "indices of the conv maps that attention transfer compares "
                                               "(negative: from the last)", none="all conv maps",
                                               check=_some_layers)


def teacher_outputs(model, teacher, x, train: bool = True, mask=None):
    """The frozen teacher's ModelOutput on ``x`` (no gradient reaches ``teacher``);
    in train mode its BatchNorm statistics come from the rows ``mask`` marks real."""
    return model.apply(jax.lax.stop_gradient(teacher), x, train=train, mask=mask)


def pfakd_objective(model, teacher, beta: float = 1.0, gamma: float = 0.0, at_layers=(),
                    teacher_train_mode: bool = True):
    """PFAKD's local loss as an objective ``(variables, batch, key) -> (loss, batch_stats)``.

    loss = CE(student logits, y) + beta * feature_distillation(student features,
    teacher features) [+ gamma * sum over ``at_layers`` of attention_transfer(
    student map, teacher map)]. ``teacher`` is a variables dict holding the
    frozen global body; the student is ``variables``. ``teacher_train_mode``
    matters only with BatchNorm (see the module docstring); the returned
    statistics are the student's.
    """
    at_layers = tuple(at_layers or ())

    def objective(variables, batch, key):
        out = model.apply(variables, batch.x, train=True, mask=batch.mask)
        loss = losses.cross_entropy(out.logits, batch.y, batch.mask)
        t_out = teacher_outputs(model, teacher, batch.x, train=teacher_train_mode, mask=batch.mask)
        t_features = jax.lax.stop_gradient(t_out.features)
        loss = loss + beta * losses.feature_distillation(out.features, t_features, batch.mask)
        if at_layers:
            at = sum(losses.attention_transfer(out.maps[j], jax.lax.stop_gradient(t_out.maps[j]), batch.mask)
                     for j in at_layers)
            loss = loss + gamma * at
        return loss, out.batch_stats

    return objective


def conv_maps(model, variables) -> int:
    """How many intermediate conv maps ``model`` gives (``variables``: its shapes; nothing is computed)."""
    x = jax.ShapeDtypeStruct((1, *model.input_shape), jnp.float32)
    return len(jax.eval_shape(lambda v, x: model.apply(v, x, train=False).maps, variables, x) or ())


def check_attention_layers(name, options, facts: RunFacts) -> None:
    """PFAKD+AT needs conv maps, and ``at_layers`` within them."""
    if facts.model is None:
        return
    count = conv_maps(facts.model, facts.variables)
    if count == 0:
        raise UserError(f"{name} needs a model with intermediate conv maps (e.g. pfakd_cnn or resnet18), "
                        "not an MLP; use --method pfakd instead")
    bad = [j for j in options.at_layers or () if not -count <= j < count]
    if bad:
        raise UserError(f"method.at_layers {bad} out of range: this model has {count} conv maps "
                        f"(indices 0..{count - 1})")


def attention_layers(m) -> tuple[int, ...]:
    """PFAKD+AT's conv maps (`check_attention_layers` held ``at_layers`` to the model's)."""
    count = conv_maps(m.model, jax.eval_shape(m.model.init, jax.random.key(0)))
    wanted = m.hparams.at_layers
    return tuple(range(count)) if wanted is None else tuple(sorted({j % count for j in wanted}))


def local_objective(m, teacher):
    """PFAKD's loss with this run's options; PFAKD+AT's attention term on its layers (``m.static``)."""
    h = m.hparams
    gamma, layers = (h.gamma, m.static) if m.static is not None else (0.0, ())
    return pfakd_objective(m.model, teacher, h.beta, gamma, layers, h.teacher_train_mode)


def client_update(m, server, client, data, key, info):
    """Steps 1-3: receive the global body, distil from its frozen copy for E epochs, upload the body."""
    variables = shared_body.receive(m, server, client)
    teacher = jax.lax.stop_gradient(variables)  # received global body + own head, frozen for the round
    local = m.local
    variables, loss, kept = training.train_kept(local, local_objective(m, teacher), client, variables, data, key,
                                                info.epochs)
    return shared_body.upload(local, client, variables, loss, kept)


_PAPER = dict(authors="Qi et al.", title="Personalized Federated Learning with Feature Alignment via Knowledge "
              "Distillation", venue="OpenReview (Udsxwsvecv)", url="https://openreview.net/forum?id=Udsxwsvecv",
              code="fei0829/PFAKD")

PFAKD = Algorithm(
    name="pfakd",
    paper=Paper("PFAKD", **_PAPER),
    hparams_type=PFAKDConfig,
    eval_models=shared_body.EVAL_MODELS,
    needs_body_head_split=True,
    keeps_optimizer_state=True,
    init=shared_body.init,
    client_update=client_update,
    server_update=shared_body.server_update,
    eval_variables=shared_body.eval_variables,
)

PFAKD_AT = dataclasses.replace(
    PFAKD,
    name="pfakd_at",
    paper=Paper("PFAKD+AT", **_PAPER, note="PFAKD plus attention transfer. The paper names PFAKD+AT but does not "
                "define it; this is this library's reading."),
    hparams_type=PFAKDATConfig,
    static=attention_layers,
    check=check_attention_layers,
)
