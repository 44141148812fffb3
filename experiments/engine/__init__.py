"""The in-process engine for studies: the project's ServerApp and ClientApp run unchanged, the server in one
process and the clients on a pool of worker processes, every message serialized into Flower's objects both ways
(as on the wire), with no SuperLink, Ray or per-message process start in between."""
