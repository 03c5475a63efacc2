"""Cluster launchers of the training job; ``jobspec`` builds the PyTorchJob without a client."""
