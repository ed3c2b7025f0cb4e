"""FedRep (Collins et al. 2021): body averaged, head private; locally the head is
trained first (``head_epochs``, default 1) with the body fixed, then the body for
E epochs with the head fixed. Evaluation (``eval.model``): ``global`` by default
(the received global body with the client's own head, as the authors' code),
or ``local``."""

import dataclasses

import jax

from fedjax_pfl.methods.shared_body import SharedBodyMethod
from fedjax_pfl.methods.options import Options, option


@dataclasses.dataclass(frozen=True)
class FedRepConfig(Options):
    head_epochs: int = option(1, "head-only epochs (body fixed) before the E body-only epochs", at_least=1)


class FedRep(SharedBodyMethod):
    name = "fedrep"
    keeps_optimizer_state = False  # trains with its own steps, not train_kept
    hparams_type = FedRepConfig

    def local_phase(self, server, client, variables, data, key, info):
        k_head, k_body = jax.random.split(key)
        objective = self.supervised_objective()
        h = self.hparams.head_epochs
        variables, _ = self.train(objective, variables, data, k_head, h, part="head", max_epochs=h)
        variables, loss = self.train(objective, variables, data, k_body, info.epochs, part="body")
        return variables, loss, {}
