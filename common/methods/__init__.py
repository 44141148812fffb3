"""Each algorithm's math on plain arrays: aggregation, masks, attention, DM-PFL, FLIU, FedFomo, DapperFL."""
