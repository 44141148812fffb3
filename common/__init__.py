"""Framework-free core: config, data, models, the training and evaluation loops."""
