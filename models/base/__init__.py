"""What every model kind is and offers training: the kind registry and the protocol a model kind
implements, its training objective, and optimizer parameter groups."""
