"""Flax models with an explicit body/head split, and the registry of them by name.

Every model is a ``BodyHead`` module: ``body(x) -> (features, maps)`` and
``head(features) -> logits``. Parameters live under ``params['body']`` and
``params['head']``; BatchNorm statistics (ResNets only) under
``batch_stats['body']``. Whether those statistics are shared with the body or
kept local is the method's decision: the model only exposes them.

The head is the last Dense layer (docs/methods/conventions.md "Shared conventions"), except for
``pfakd_cnn``, whose head is the PFAKD authors' 2-layer MLP. The feature is the
body output (post-activation), i.e. the head's input. ``maps`` are the
post-activation (and post-pooling) outputs of each conv block, or of each
ResNet stage, for attention transfer; empty for MLPs.

Registered models (inputs NHWC, already normalised; MLPs flatten):

* ``mlr``: identity body (flatten; feature = input), head Dense(C).
* ``mlp``: Dense+ReLU for each of ``hidden`` (default (200, 200); pFedKD uses
  (128,), DiversiFed (64,)), head Dense(C).
* ``fedavgcnn``: PFLlib's FedAvgCNN: conv5x5 32 VALID, ReLU, maxpool 2,
  conv5x5 64 VALID, ReLU, maxpool 2, flatten, Dense 512 ReLU; head Dense(C).
* ``lenet``: conv5x5 6, ReLU, maxpool 2, conv5x5 16, ReLU, maxpool 2 (VALID),
  flatten (400 at 32x32), Dense 120, 84 (ReLU); head Dense(C).
* ``pfl_cnn``: pfl-research's CIFAR-10 benchmark CNN (its ``simple_cnn``):
  conv3x3 32 VALID, ReLU, conv3x3 64 VALID, ReLU, maxpool 2, flatten (12,544
  at 32x32), Dense 128 ReLU; head Dense(C). ``dropout=True`` adds its two
  dropout layers (`PFL_DROPOUT`: 0.25 after the pool, 0.5 after Dense 128,
  so the feature is the dropped-out one the head sees) in training; at
  28x28x1 with 62 classes it is also FedJAX's EMNIST CNN.
* ``pfakd_cnn``: the PFAKD authors' CNN: conv3x3 16, conv4x4 32, conv3x3 64
  (VALID, each ReLU + maxpool 2), flatten (256 at 32x32, 64 at 28x28) = the
  feature; head Dense 64 ReLU, Dense(C).
* ``pfakd_cnn_fmnist``: the PFAKD authors' Fashion-MNIST CNN (their CNN_FMNIST):
  conv5x5 16 pad 0, conv5x5 32 pad 1 (each ReLU + maxpool 2), flatten (800 at
  28x28), Dense 128 ReLU = the feature; head Dense(C). About 117k parameters.
* ``fedpac_cnn``: the FedPAC authors' CNNs, leaky ReLU (slope 0.01), maxpool 2
  after each conv. ``variant='cifar'``: conv5x5 16 pad 0, conv5x5 32 pad 1,
  conv3x3 64 pad 1, Dense 128; ``variant='fmnist'``: the first two convs only,
  Dense 128. ``'auto'`` (default) takes 'fmnist' for 1-channel inputs.
  Feature dim 128; head Dense(C).
* ``resnet8`` / ``resnet18``: CIFAR-style ResNets (3x3 stem, no stem pooling,
  BasicBlocks, 1x1 conv + BN shortcut when the shape changes, global average
  pool). resnet8: widths 16/32/64, one block per stage (the 6n+2 family);
  resnet18: widths 64/128/256/512, two blocks per stage. BatchNorm with
  PyTorch's defaults (momentum 0.1, eps 1e-5), batch statistics when
  ``train=True`` (over the rows that ``mask`` marks real), running averages
  otherwise.

A model with dropout trains with a key (``Model.apply(..., train=True, rng=key)``: the local step's key, folded
with `DROPOUT_STREAM`); evaluation (``train=False``) drops nothing.

Convolutions use ``conv.Conv2D`` and fully connected layers ``dense.Dense``,
both with ``conv_impl`` ('auto' picks direct on CPU and GPU, native elsewhere; a
Dense layer has no im2col form and computes as native then); the parameter
tree does not depend on it.
``init`` ('flax' or 'torch') picks where the parameters start
(``initialization.py``: Flax's defaults, or PyTorch's as in the papers' code).
``precision`` ('fp32' or 'bf16') is what the layers compute in; parameters
and outputs are float32 either way (``precision.py``).
This file must not hold training logic, losses or method-specific code.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_pfl.models.conv import Conv2D, Padding, max_pool, resolve_conv_impl
from fedjax_pfl.models.dense import Dense
from fedjax_pfl.models.initialization import INITS, reinitialize
from fedjax_pfl.models.precision import compute_dtype, to_float32
from fedjax_pfl.core.errors import UserError


class ModelOutput(NamedTuple):
    """What ``Model.apply`` returns."""

    logits: jax.Array  # [B, C]
    features: jax.Array  # [B, feature_dim]: body output = head input
    maps: tuple  # intermediate conv maps [B, H, W, C]; () for MLPs
    batch_stats: dict  # updated when train=True and the model has BN


# ----------------------------------------------------------------- blocks --


class ConvSpec(NamedTuple):
    features: int
    kernel_size: int
    padding: Padding = "VALID"
    pool: bool = True  # a 2x2 max-pool after the activation


class DenseStack(nn.Module):
    """Dense + activation for each hidden size."""

    hidden: Sequence[int]
    activation: Callable = nn.relu
    impl: str = "auto"
    dtype: Any = None  # compute dtype (models/precision.py); None: the input's

    @nn.compact
    def __call__(self, x):
        for i, width in enumerate(self.hidden):
            x = self.activation(Dense(width, resolve_conv_impl(self.impl), self.dtype, name=f"dense{i}")(x))
        return x


class ConvNetBody(nn.Module):
    """Conv blocks (conv, activation, 2x2 max-pool unless the spec says no pool), flatten, then a DenseStack;
    in training, dropout at rate ``dropout[0]`` after the conv blocks and ``dropout[1]`` after the DenseStack
    (none by default)."""

    convs: Sequence[ConvSpec] = ()
    hidden: Sequence[int] = ()
    activation: Callable = nn.relu
    conv_impl: str = "auto"
    dtype: Any = None
    dropout: tuple[float, float] = (0.0, 0.0)

    @nn.compact
    def __call__(self, x, train: bool = False, mask=None):  # no BatchNorm: mask unused
        maps = []
        for i, spec in enumerate(self.convs):
            x = Conv2D(spec.features, spec.kernel_size, padding=spec.padding,
                       impl=self.conv_impl, dtype=self.dtype, name=f"conv{i}")(x)
            x = self.activation(x)
            x = max_pool(x, 2) if spec.pool else x
            maps.append(x)
        x = _dropout(x, self.dropout[0], train)
        x = x.reshape(x.shape[0], -1)
        x = DenseStack(self.hidden, self.activation, self.conv_impl, self.dtype, name="mlp")(x)
        return _dropout(x, self.dropout[1], train), tuple(maps)


def _dropout(x, rate: float, train: bool):
    """``x`` with each entry zeroed at ``rate`` and the others scaled by 1 / (1 - rate) in training; as is
    otherwise."""
    return nn.Dropout(rate, deterministic=not train)(x) if rate else x


class Head(nn.Module):
    """Optional hidden Dense+ReLU layers, then the logits layer."""

    num_classes: int
    hidden: Sequence[int] = ()
    impl: str = "auto"  # conv_impl: 'direct' writes the Dense gradients as canonical matmuls (dense.py)
    dtype: Any = None

    @nn.compact
    def __call__(self, features):
        x = DenseStack(self.hidden, impl=self.impl, dtype=self.dtype, name="mlp")(features) if self.hidden else features
        return Dense(self.num_classes, resolve_conv_impl(self.impl), self.dtype, name="logits")(x)


def _batch_norm(x, train: bool, mask, name: str, dtype=None):
    """BatchNorm of ``x [B, H, W, C]``; with ``mask [B]`` statistics come from real rows only. Statistics and
    running averages are float32 whatever ``dtype`` (flax computes them in at least float32)."""
    bn = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, dtype=dtype, name=name)
    if mask is None or not train:
        return bn(x)
    rows = jnp.asarray(mask, bool)
    rows = rows | ~jnp.any(rows)  # an all-padding batch (a skipped step) keeps plain statistics: no NaN
    return bn(x, mask=jnp.broadcast_to(rows.reshape((-1,) + (1,) * (x.ndim - 1)), x.shape))


class BasicBlock(nn.Module):
    """Two 3x3 conv + BN layers with a residual connection (He et al., 2016)."""

    features: int
    strides: int = 1
    conv_impl: str = "auto"
    dtype: Any = None

    def _conv_bn(self, x, kernel_size, strides, train, mask, names):
        conv_name, bn_name = names
        x = Conv2D(self.features, kernel_size, strides, "SAME", use_bias=False,
                   impl=self.conv_impl, dtype=self.dtype, name=conv_name)(x)
        return _batch_norm(x, train, mask, bn_name, self.dtype)

    @nn.compact
    def __call__(self, x, train: bool, mask=None):
        y = nn.relu(self._conv_bn(x, 3, self.strides, train, mask, ("conv0", "bn0")))
        y = self._conv_bn(y, 3, 1, train, mask, ("conv1", "bn1"))
        if self.strides != 1 or x.shape[-1] != self.features:
            x = self._conv_bn(x, 1, self.strides, train, mask, ("shortcut_conv", "shortcut_bn"))
        return nn.relu(x + y)


class ResNetBody(nn.Module):
    """CIFAR-style ResNet body: 3x3 stem, stages of BasicBlocks, global average pool."""

    widths: Sequence[int]
    blocks_per_stage: Sequence[int]
    conv_impl: str = "auto"
    dtype: Any = None

    @nn.compact
    def __call__(self, x, train: bool = False, mask=None):
        x = Conv2D(self.widths[0], 3, 1, "SAME", use_bias=False, impl=self.conv_impl,
                   dtype=self.dtype, name="stem_conv")(x)
        x = nn.relu(_batch_norm(x, train, mask, "stem_bn", self.dtype))
        maps = []
        for s, (width, blocks) in enumerate(zip(self.widths, self.blocks_per_stage)):
            for b in range(blocks):
                strides = 2 if (s > 0 and b == 0) else 1
                x = BasicBlock(width, strides, self.conv_impl, self.dtype, name=f"stage{s}_block{b}")(
                    x, train, mask)
            maps.append(x)
        return x.mean(axis=(-3, -2)), tuple(maps)


class BodyHead(nn.Module):
    """The model: ``(logits, features, maps)`` from ``body`` then ``head``."""

    body: nn.Module
    head: nn.Module

    def __call__(self, x, train: bool = False, mask=None):
        features, maps = self.body(x, train=train, mask=mask)
        return self.head(features), features, maps

    def apply_head(self, features):
        return self.head(features)


# ------------------------------------------------------------------ model --


@dataclasses.dataclass(frozen=True)
class Model:
    """A built model: a ``BodyHead`` module plus its input and output sizes."""

    name: str
    module: nn.Module
    input_shape: tuple
    num_classes: int
    feature_dim: int
    initialization: str = "flax"  # 'flax' | 'torch' (initialization.py)
    precision: str = "fp32"  # 'fp32' | 'bf16' (precision.py): what the layers compute in; outputs are float32
    dropout: bool = False  # training drops activations: `apply` with train=True needs a key

    def init(self, key: jax.Array) -> dict:
        """Variables ``{'params': {'body', 'head'}}`` (+ ``{'batch_stats': {'body'}}`` with BN),
        drawn as ``initialization`` says."""
        x = jnp.zeros((1,) + tuple(self.input_shape), jnp.float32)
        variables = dict(self.module.init(key, x, train=False))
        params = dict(variables["params"])
        params.setdefault("body", {})  # mlr's body has no parameters
        params = {"body": params["body"], "head": params["head"]}
        variables["params"] = reinitialize(params, jax.random.fold_in(key, 1), self.initialization)
        return variables

    def apply(self, variables: dict, x: jax.Array, *, train: bool = False,
              mask: jax.Array | None = None, rng: jax.Array | None = None) -> ModelOutput:
        """Runs the model on ``x [B, *input_shape]``; BN uses batch stats when training.

        ``mask [B]`` (bool, False for padding rows) restricts BatchNorm's batch
        statistics and running-average updates to the real rows, so a padded
        batch trains exactly as the unpadded one; it changes nothing else
        (losses mask their own rows) and nothing when ``train=False``.
        ``rng``: the key a model with dropout draws its training masks from (folded with `DROPOUT_STREAM`);
        such a model trained without one raises `UserError`.
        Under ``precision='bf16'`` logits, features and maps come back float32.
        """
        stats = variables.get("batch_stats", {})
        rngs = {}
        if train and self.dropout:
            if rng is None:
                raise UserError(f"model {self.name!r} with dropout trains with a key per step, and this method's "
                                "local step gives it none: leave model.dropout false for this method")
            rngs = {"dropout": jax.random.fold_in(rng, DROPOUT_STREAM)}
        if train and stats:
            (logits, features, maps), updates = self.module.apply(
                variables, x, train=True, mask=mask, mutable=["batch_stats"], rngs=rngs)
            stats = updates["batch_stats"]
        else:
            logits, features, maps = self.module.apply(variables, x, train=train, rngs=rngs)
        logits, features, maps = to_float32((logits, features, maps), self.precision)
        return ModelOutput(logits, features, maps, stats)

    def apply_head(self, variables: dict, features: jax.Array) -> jax.Array:
        """Logits of the head alone on given features ``[B, feature_dim]`` (float32 under 'bf16')."""
        return to_float32(self.module.apply({"params": {"head": variables["params"]["head"]}},
                                            features, method=BodyHead.apply_head), self.precision)


# --------------------------------------------------------------- registry --


def _need_image(name: str, input_shape: tuple) -> None:
    if len(input_shape) != 3:
        raise UserError(
            f"Model {name!r} needs image inputs (height, width, channels); got input "
            f"shape {input_shape}. Use 'mlr' or 'mlp' for vector data.")


def _mlr(input_shape, num_classes, conv_impl):
    return ConvNetBody(conv_impl=conv_impl), Head(num_classes, impl=conv_impl)


def _mlp(input_shape, num_classes, conv_impl, hidden: Sequence[int] = (200, 200)):
    return ConvNetBody(hidden=tuple(hidden), conv_impl=conv_impl), Head(num_classes, impl=conv_impl)


def _fedavgcnn(input_shape, num_classes, conv_impl):
    _need_image("fedavgcnn", input_shape)
    convs = (ConvSpec(32, 5), ConvSpec(64, 5))
    return ConvNetBody(convs, (512,), conv_impl=conv_impl), Head(num_classes, impl=conv_impl)


def _lenet(input_shape, num_classes, conv_impl):
    _need_image("lenet", input_shape)
    convs = (ConvSpec(6, 5), ConvSpec(16, 5))
    return ConvNetBody(convs, (120, 84), conv_impl=conv_impl), Head(num_classes, impl=conv_impl)


PFL_DROPOUT = (0.25, 0.5)  # pfl-research's simple_cnn (and FedJAX's EMNIST CNN): after the pool, after Dense 128
DROPOUT_STREAM = 2  # fold_in constant of the dropout keys (augmentation's is 1: kernels/local_training.py)


def _pfl_cnn(input_shape, num_classes, conv_impl, dropout: bool = False):
    _need_image("pfl_cnn", input_shape)
    convs = (ConvSpec(32, 3, pool=False), ConvSpec(64, 3))
    body = ConvNetBody(convs, (128,), conv_impl=conv_impl, dropout=PFL_DROPOUT if dropout else (0.0, 0.0))
    return body, Head(num_classes, impl=conv_impl)


def _pfakd_cnn(input_shape, num_classes, conv_impl):
    _need_image("pfakd_cnn", input_shape)
    convs = (ConvSpec(16, 3), ConvSpec(32, 4), ConvSpec(64, 3))
    return ConvNetBody(convs, (), conv_impl=conv_impl), Head(num_classes, hidden=(64,), impl=conv_impl)


_TWO_CONVS_5X5 = (ConvSpec(16, 5, 0), ConvSpec(32, 5, 1))  # PFAKD's CNN_FMNIST and FedPAC's FMNIST CNN


def _pfakd_cnn_fmnist(input_shape, num_classes, conv_impl):
    _need_image("pfakd_cnn_fmnist", input_shape)
    return ConvNetBody(_TWO_CONVS_5X5, (128,), conv_impl=conv_impl), Head(num_classes, impl=conv_impl)


def _fedpac_cnn(input_shape, num_classes, conv_impl, variant: str = "auto"):
    _need_image("fedpac_cnn", input_shape)
    if variant == "auto":
        variant = "fmnist" if input_shape[-1] == 1 else "cifar"
    convs = {"cifar": (ConvSpec(16, 5, 0), ConvSpec(32, 5, 1), ConvSpec(64, 3, 1)),
             "fmnist": _TWO_CONVS_5X5}
    if variant not in convs:
        raise UserError(f"fedpac_cnn variant must be 'auto', 'cifar' or 'fmnist', got {variant!r}.")
    body = ConvNetBody(convs[variant], (128,), nn.leaky_relu, conv_impl)
    return body, Head(num_classes, impl=conv_impl)


def _resnet(widths, blocks, label):
    def build(input_shape, num_classes, conv_impl):
        _need_image(label, input_shape)
        return ResNetBody(widths, blocks, conv_impl), Head(num_classes, impl=conv_impl)
    return build


_REGISTRY: dict[str, Callable[..., tuple[nn.Module, nn.Module]]] = {
    "mlr": _mlr,
    "mlp": _mlp,
    "fedavgcnn": _fedavgcnn,
    "lenet": _lenet,
    "pfakd_cnn": _pfakd_cnn,
    "pfakd_cnn_fmnist": _pfakd_cnn_fmnist,
    "pfl_cnn": _pfl_cnn,
    "fedpac_cnn": _fedpac_cnn,
    "resnet8": _resnet((16, 32, 64), (1, 1, 1), "resnet8"),
    "resnet18": _resnet((64, 128, 256, 512), (2, 2, 2, 2), "resnet18"),
}


def default_model(is_image: bool) -> str:
    """The model ``model.name=auto`` takes: the FedAS paper's CNN for images, an MLP for feature vectors."""
    return "fedavgcnn" if is_image else "mlp"


def model_names() -> list[str]:
    """Names accepted by ``build_model``."""
    return sorted(_REGISTRY)


def build_model(name: str, input_shape: Sequence[int], num_classes: int, *,
                conv_impl: str = "auto", init: str = "flax", precision: str = "fp32", **kwargs: Any) -> Model:
    """Builds a registered model for inputs ``[B, *input_shape]`` and ``num_classes``.

    ``init`` is where parameters start: 'flax' (Flax's defaults) or 'torch'
    (PyTorch's defaults, as in the papers' code; ``initialization.py``).
    ``precision`` is what its layers compute in: 'fp32' or 'bf16' (``precision.py``).
    ``kwargs`` are model options (``hidden`` for mlp, ``variant`` for fedpac_cnn, ``dropout`` for pfl_cnn).
    Raises ``UserError`` for an unknown name or option, or an input shape the
    model cannot take.
    """
    if name not in _REGISTRY:
        raise UserError(f"Unknown model {name!r}; valid names: {', '.join(model_names())}.")
    if init not in INITS:
        raise UserError(f"Unknown model init {init!r}; choose one of: {', '.join(INITS)}.")
    input_shape = tuple(int(d) for d in input_shape)
    builder = _REGISTRY[name]
    options = list(inspect.signature(builder).parameters)[3:]
    unknown = sorted(set(kwargs) - set(options))
    if unknown:
        raise UserError(f"Model {name!r} has no option(s) {unknown}; its options: "
                        f"{options or 'none'}.")
    conv_impl = resolve_conv_impl(conv_impl)
    dtype = compute_dtype(precision)
    try:
        body, head = builder(input_shape, int(num_classes), conv_impl, **kwargs)
    except (ValueError, TypeError) as e:
        raise UserError(f"Bad option for model {name!r} ({kwargs}): {e}") from e
    if dtype is not None:
        body, head = body.clone(dtype=dtype), head.clone(dtype=dtype)
    module = BodyHead(body, head)
    x = jax.ShapeDtypeStruct((1,) + input_shape, jnp.float32)
    try:
        _, features, _ = jax.eval_shape(
            lambda x: module.init_with_output(jax.random.PRNGKey(0), x)[0], x)
    except (ValueError, TypeError) as e:
        raise UserError(f"Model {name!r} cannot take inputs of shape {input_shape}: {e}") from e
    dropout = any(getattr(body, "dropout", (0.0,)))
    return Model(name, module, input_shape, int(num_classes), int(features.shape[-1]), init, precision, dropout)
