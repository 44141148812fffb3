"""The wire format: message names, the sparse codec, Flower records, payload validation."""
