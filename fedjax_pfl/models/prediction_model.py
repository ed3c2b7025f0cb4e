"""A model whose evaluation-time prediction is a method's own rule.

The engine evaluates every client with ``method.model.apply(variables, x,
train=False).logits`` on the variables of ``method.eval_variables``. Most
methods predict with one pass of the model; a few do not: kNN-Per mixes a
k-nearest-neighbour label distribution with the model's softmax, GPFL passes
the feature through its conditional valve before the head. Such a method
exposes a `PredictionModel` as its ``model``: variables that carry the
``'prediction'`` collection (which only its ``eval_variables`` adds) are
predicted with the method's ``predict(variables, x) -> ModelOutput``; every
other call (training, statistics passes) is the base model's, unchanged.

(A ``Method.predict`` hook called by the engine would make this wrapper
unnecessary; the engine is not this module's to change.)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

from fedjax_pfl.models.networks import Model, ModelOutput

PREDICTION = "prediction"


@dataclasses.dataclass(frozen=True, eq=False)
class PredictionModel(Model):
    """``Model`` plus ``predict``, used for variables that hold a ``'prediction'`` collection."""

    predict: Callable[[dict, object], ModelOutput] | None = None

    @classmethod
    def wrap(cls, base: Model, predict: Callable[[dict, object], ModelOutput]) -> "PredictionModel":
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(Model)}
        return cls(**fields, predict=predict)

    def apply(self, variables: dict, x, *, train: bool = False, **kwargs) -> ModelOutput:
        if PREDICTION in variables:
            return self.predict(variables, x)
        return super().apply(variables, x, train=train, **kwargs)


def model_variables(variables: dict) -> dict:
    """``variables`` without the ``'prediction'`` collection (what the base model takes)."""
    return {k: v for k, v in variables.items() if k != PREDICTION}


class OwnPrediction:
    """Mixin for a Method (listed before it in the bases) that predicts with its own
    ``predict(variables, x) -> ModelOutput``: its ``model`` is the wrapped setup model."""

    @functools.cached_property
    def model(self) -> PredictionModel:
        return PredictionModel.wrap(self.setup.model, self.predict)
