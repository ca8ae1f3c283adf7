"""Training: the one loop (:mod:`.loop`: ``train_block``, a single run is a block of one) and the
pieces it calls, one concern each (:mod:`.config`, :mod:`.setup`, :mod:`.step`, :mod:`.scores`,
:mod:`.divergence`, :mod:`.resume`, :mod:`.hooks`), the vectorised stack of a seed range's models
(:mod:`.seed_block`), what a checkpoint leaves (:mod:`.record`, :mod:`.archive`) and the model
files it writes and reads (:mod:`.checkpoints`)."""
