"""Training and evaluation: the models, the one training loop, the one evaluation loop, FLOPs, stages."""
