"""Processes and devices: the process group, the data-parallel strategy, numeric precision.

``dist`` is the only module that reads torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE) or
touches the process group; it hands a frozen ``DistContext`` to everything else. ``sharding``
chooses DDP or FSDP2 and applies it; ``precision`` picks the autocast dtype and gradient scaler.
"""
