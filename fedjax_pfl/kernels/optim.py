"""Client optimizers, PyTorch-equivalent: SGD (momentum, L2 weight decay) and Adam."""

import optax

from fedjax_pfl.core.errors import UserError

OPTIMIZERS = ("sgd", "adam")


def make_optimizer(name: str, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
    """torch.optim.SGD / Adam semantics: weight decay is added to the gradient."""
    if isinstance(lr, (int, float)) and lr <= 0:  # a traced lr (method_values.py) is checked before tracing
        raise UserError(f"learning rate must be > 0, got {lr}")
    if name == "sgd":
        core = optax.sgd(lr, momentum=momentum or None)
    elif name == "adam":
        core = optax.adam(lr)
    else:
        raise UserError(f"unknown optimizer {name!r}; choose one of: {', '.join(OPTIMIZERS)}")
    if weight_decay:
        return optax.chain(optax.add_decayed_weights(weight_decay), core)
    return core
