"""Training: the one loop (:mod:`.loop`: ``train_block``, a single run is a block of one), the
vectorised stack of a seed range's models (:mod:`.seed_block`) and the model files it writes and
reads (:mod:`.checkpoints`)."""
