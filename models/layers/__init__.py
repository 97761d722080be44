"""Building blocks the models share: pre-norm transformer blocks, chunked bounded-memory passes, position
encodings, attention pooling, input standardisation."""
