"""Whether a round's collaboration diagnostics (Method.round_diagnostics) show clients learning from others."""

# A mean self-weight above this is Local in disguise: the server step barely mixes.
MIXING_BAR = 0.995


def assert_clients_mix(metrics: dict) -> dict:
    """The round's diagnostics as floats, after asserting weight on other clients' models, a self-weight
    below `MIXING_BAR` and models that differ."""
    values = {k: float(v) for k, v in metrics["diagnostics"].items()}
    assert 0.0 < values["other_weight"] and values["self_weight"] < MIXING_BAR, values
    assert values["distance_max"] >= values["distance_mean"] > 0, values
    return values
