"""FedPer (Arivazhagan et al. 2019): body averaged with weights n_i, head private;
local training updates body and head together (the SharedBodyMethod default).
Evaluation (``eval.model``): ``global`` by default (global body + own head, as
PFLlib), or ``local``."""

from fedjax_pfl.methods.shared_body import SharedBodyMethod


class FedPer(SharedBodyMethod):
    name = "fedper"
