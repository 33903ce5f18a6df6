"""Package data: the model catalog (copy of tests/data/fixtures/placement/model_configs.json) and the GPU table."""
