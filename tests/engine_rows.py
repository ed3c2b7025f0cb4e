"""A lone engine's runs as federations, rows of one program (engine/rows.py): its data shared, a key each
(and grid values each, name -> [F])."""

from fedjax_pfl.engine.rows import Federation, FederationRows


def rows_of(eng, count: int) -> FederationRows:
    """``count`` federations of ``eng``'s method, data and settings."""
    return FederationRows(eng.method, [Federation(*eng.client_data, eng.config.clients_per_round)] * count,
                          eng.config)


def run_rows(eng, init_keys, keys, rounds: int, eval_every: int, values=None):
    """(pool, servers, clients, [metrics], [evaluations]) of rounds 0..rounds-1 of ``len(keys)`` federations of
    ``eng``, federation f from ``init_keys[f]`` and run key ``keys[f]``."""
    pool = rows_of(eng, len(keys))
    servers, clients = pool.init(init_keys)
    return (pool, *pool.run_rounds(servers, clients, keys, 0, rounds, rounds, eval_every, values=values))
