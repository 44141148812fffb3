"""Server half: the ServerApp, the strategies, reply validation and the results folder."""
