"""Pure per-batch losses: the public face. Every function is jit-able and usable without the engine.

    from fedjax_pfl.losses import feature_distillation, class_mean_alignment, kd_kl

Shapes: B batch, C classes, d feature width. ``mask`` [B] (bool or 0/1) marks
real samples; padded samples contribute nothing and the mean is over real ones
(a batch with no real sample gives 0, never NaN). The functions live in
`fedjax_pfl.kernels` (batch_losses; DiversiFed's model-distance loss in
model_distance; pFedKD-WCL's server KL in kd_server); this module only names
them in one place.
"""

from fedjax_pfl.kernels.batch_losses import (
    accuracy_counts,
    attention_map,
    attention_transfer,
    balanced_softmax_cross_entropy,
    class_counts,
    class_mean_alignment,
    cross_entropy,
    feature_distillation,
    feature_mse,
    kd_kl,
    masked_mean,
    output_mixture_cross_entropy,
    proximal,
    sample_alignment,
    sample_mask,
    weighted_kd_loss,
)
from fedjax_pfl.kernels.kd_server import client_server_gradient, server_kl, server_kl_gradient
from fedjax_pfl.kernels.model_distance import model_distance_loss, model_distance_loss_grad

__all__ = [
    "accuracy_counts", "attention_map", "attention_transfer", "balanced_softmax_cross_entropy", "class_counts",
    "class_mean_alignment", "client_server_gradient", "cross_entropy", "feature_distillation", "feature_mse",
    "kd_kl", "masked_mean", "model_distance_loss", "model_distance_loss_grad", "output_mixture_cross_entropy",
    "proximal", "sample_alignment", "sample_mask", "server_kl", "server_kl_gradient", "weighted_kd_loss",
]
