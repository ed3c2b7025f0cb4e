"""Fine-tuning at evaluation: one option for every method that evaluates a global model.

FedAvg-FT / FedProx-FT (the FedAS paper's FedAvg-P / FedProx-P) and FedBABU's
personalization step are the same operation: before testing, each client
trains a copy of the model it is evaluated with for ``finetune_epochs`` epochs
of cross-entropy on its own train data, on ``finetune_part`` ('all', 'head' or
'body'), with the run's optimizer started fresh. The copy is thrown away after
the test: the stored server and client state never changes. A method opts in
by deriving its options from `FineTuneConfig` and passing the variables it
evaluates through `finetuned` in its ``eval_variables``.

Command line: ``--method fedavg method.finetune_epochs=5`` (FedAvg-FT with E=5),
``method.finetune_part=head`` to tune the head only.
"""

from __future__ import annotations

import dataclasses

from fedjax_pfl.core.tree_ops import PARTS
from fedjax_pfl.methods import training
from fedjax_pfl.methods.base import LocalTraining
from fedjax_pfl.methods.options import Options, option


@dataclasses.dataclass(frozen=True)
class FineTuneConfig(Options):
    finetune_epochs: int = option(0, "epochs each client fine-tunes the evaluated model on its train data "
                                  "before testing (0: test it as it is)", at_least=0)
    finetune_part: str = option("all", "which part is fine-tuned", choices=PARTS)


def finetuned(m, local: LocalTraining, variables, data, key):
    """``variables`` after the evaluation-time fine-tuning of ``m.hparams`` (a `FineTuneConfig`) on ``data``
    (one client), with ``local``'s optimizer, batch size and normalisation."""
    epochs = m.hparams.finetune_epochs
    if epochs == 0:
        return variables
    tuned, _ = training.train(local, training.supervised_objective(m), variables, data, key, epochs,
                              part=m.hparams.finetune_part, max_epochs=epochs)
    return tuned
