"""FedBABU (Oh, Kim & Yun, ICLR 2022, "FedBABU: Toward Enhanced Representation
for Federated Image Classification"): body aggregation and body update.

Federated training: every client starts from the global body and the head of
the shared random initialisation, trains the body only for E epochs (the head
is never updated, so it stays equal on every client), and uploads the body;
the server averages bodies with weights n_i. Evaluation protocol: the global
body with that head, fine-tuned on each client's train data before testing
(methods/finetune.py: ``finetune_epochs``, default 5 = the paper's tau;
``finetune_part``, default 'head' as docs/methods/conventions.md settles it, 'all' for the
paper's whole-model variant). The fine-tuned copy is never stored.

Choices: fine-tuning uses the run's optimizer and learning rate (the paper
fine-tunes with the training learning rate); BatchNorm statistics travel with
the body (``train.share_batch_stats``).
"""

import dataclasses

from fedjax_pfl.core.tree_ops import PARTS
from fedjax_pfl.methods.finetune import FineTuneConfig, finetuned
from fedjax_pfl.methods.options import option
from fedjax_pfl.methods.shared_body import SharedBodyMethod


@dataclasses.dataclass(frozen=True)
class FedBABUConfig(FineTuneConfig):
    finetune_epochs: int = option(5, "epochs each client fine-tunes the global body and head on its train data "
                                  "before testing (the paper's tau)", at_least=0)
    finetune_part: str = option("head", "which part is fine-tuned", choices=PARTS)


class FedBABU(SharedBodyMethod):
    name = "fedbabu"
    keeps_optimizer_state = False  # trains with its own steps, not train_kept
    hparams_type = FedBABUConfig

    def local_phase(self, server, client, variables, data, key, info):
        variables, loss = self.train(self.supervised_objective(), variables, data, key, info.epochs, part="body")
        return variables, loss, {}

    def eval_variables(self, server, client, data, key):
        return finetuned(self, self.receive(server, client), data, key, self.hparams)
