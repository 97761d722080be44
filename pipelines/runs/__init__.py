"""A training run's folder as the other stages read it: the run record (config.json) and the weights
(safetensors)."""
