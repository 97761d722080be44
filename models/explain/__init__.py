"""Explaining a MIL model's output per tile: exact leave-one-out effects and attributions that sum to the
logit."""
