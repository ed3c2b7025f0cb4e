"""Pure server rules over stacked client trees: the public face. Every rule is jit-able and usable without the
engine.

    from fedjax_pfl.aggregation import weighted_mean, fisher_weights, mixing_matrix

Shapes: S uploading clients on the leading axis of every leaf; weights are
non-negative [S] and a zero weight excludes an upload (a dropped straggler).
The rules live in `fedjax_pfl.kernels` (weighted_average; FedAS's Fisher
weights in fisher; prototype averages in prototypes; DiversiFed's model
distances and mixing in model_distance; FedPAC's simplex QP in simplex_qp;
FedAMP's attentive message passing in attentive_mixing); this module only
names them in one place, and methods reach them through it.
"""

from fedjax_pfl.kernels.attentive_mixing import attention_weights, personalized_cloud_models
from fedjax_pfl.kernels.fisher import fisher_weights
from fedjax_pfl.kernels.model_distance import (
    apply_mixing,
    mix_models,
    mixing_matrix,
    pairwise_distances,
    pairwise_sq_distances,
    similarities,
)
from fedjax_pfl.kernels.prototypes import PROTO_WEIGHTS, prototype_aggregate, prototype_weights
from fedjax_pfl.kernels.simplex_qp import (
    combination_weights,
    combination_weights_batch,
    project_simplex,
    repair_psd,
    solve_simplex_qp,
    solve_simplex_qp_batch,
)
from fedjax_pfl.kernels.weighted_average import normalize_weights, softmax_weights, weighted_mean, weighted_mean_or

__all__ = [
    "PROTO_WEIGHTS", "apply_mixing", "attention_weights", "combination_weights", "combination_weights_batch",
    "fisher_weights", "mix_models", "mixing_matrix", "normalize_weights",
    "pairwise_distances", "pairwise_sq_distances", "personalized_cloud_models", "project_simplex",
    "prototype_aggregate", "prototype_weights", "repair_psd", "softmax_weights", "solve_simplex_qp",
    "solve_simplex_qp_batch", "weighted_mean", "weighted_mean_or",
]
