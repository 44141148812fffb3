"""Secure aggregation (SecAgg+) on plain bytes and numpy: parameters, the vector encoding and the protocol's two
sides, which the round runner's secure-aggregation phase drives; no Flower message handling here."""
