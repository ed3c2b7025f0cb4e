"""Client optimizers, PyTorch-equivalent: SGD (momentum, L2 weight decay) and Adam; and
projected SGD onto [0, 1] for mixing weights (APFL's alpha, FedALA's ALA weights)."""

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.core.errors import UserError

OPTIMIZERS = ("sgd", "adam")


def make_optimizer(name: str, lr: float, momentum: float, weight_decay: float):
    """torch.optim.SGD / Adam semantics: weight decay is added to the gradient.

    Examples:
        >>> opt = make_optimizer("sgd", 0.1, momentum=0.0, weight_decay=0.5)
        >>> w = jnp.array([1.0])
        >>> updates, _ = opt.update(jnp.array([1.0]), opt.init(w), w)
        >>> round(float(updates[0]), 4)  # -lr * (grad + decay * w)
        -0.15
    """
    if isinstance(lr, (int, float)) and lr <= 0:  # a traced lr (a round's hyperparameter) is checked before tracing
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


def projected_sgd(lr, decay: float = 0.0, every_step: bool = True) -> optax.GradientTransformation:
    """w <- clip(w - lr * (g + decay * w), 0, 1) per leaf, as an optax update.

    ``every_step=False`` steps at the first update only and leaves later
    updates zero (APFL's authors update alpha once per round).

    Examples:
        >>> opt = projected_sgd(0.5)
        >>> alpha = jnp.array([0.4, 0.9])
        >>> updates, _ = opt.update(jnp.array([0.2, -1.0]), opt.init(alpha), alpha)
        >>> [round(float(a), 4) for a in alpha + updates]  # the second step is clipped at 1
        [0.3, 1.0]
    """

    def init(params):
        return jnp.zeros((), jnp.int32)

    def update(grads, count, params):
        active = jnp.logical_or(every_step, count == 0)

        def step(g, w):
            new = jnp.clip(w - lr * (g + decay * w), 0.0, 1.0)
            return jnp.where(active, new - w, jnp.zeros_like(w))

        return jax.tree.map(step, grads, params), count + 1

    return optax.GradientTransformation(init, update)
