"""Client half: the ClientApp, client state, and one algorithm module per family."""
