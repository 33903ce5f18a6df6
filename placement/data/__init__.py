"""Package data: the model catalog (copy of fixtures/placement/model_configs.json) and the GPU table."""
