"""The model and its training: loading and decoding, the GRPO math, the step and its
optimiser."""
