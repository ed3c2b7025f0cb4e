"""Local: each client trains its own model on its own data; no communication.
Evaluation (``eval.model``): ``local``, each client's own model."""

from fedjax_pfl.methods.base import LegacyMethod as Method, shared_init


class Local(Method):
    name = "local"
    keeps_optimizer_state = True

    def init(self, key, num_clients):
        variables, clients = shared_init(self, key, num_clients)
        return {}, self.with_optimizer_state({"variables": clients}, variables, num_clients)

    def client_update(self, server, client, data, key, info):
        variables, loss, kept = self.train_kept(self.supervised_objective(), client, client["variables"], data, key,
                                                info.epochs)
        return {**client, "variables": variables, **kept}, {"loss": loss}
