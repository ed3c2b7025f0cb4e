"""Local: each client trains its own model on its own data; no communication.
Evaluation (``eval.model``): ``local``, each client's own model."""

from fedjax_pfl.methods.base import Method, shared_init


class Local(Method):
    name = "local"

    def init(self, key, num_clients):
        _, clients = shared_init(self, key, num_clients)
        return {}, {"variables": clients}

    def client_update(self, server, client, data, key, info):
        variables, loss = self.train(self.supervised_objective(), client["variables"], data, key, info.epochs)
        return {"variables": variables}, {"loss": loss}
