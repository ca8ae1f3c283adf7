"""trainmap.dynamics.metrics.weights: the metrics training streams: the 14 weight metrics (weights), every
convention from a block's weights at a checkpoint (streamed), the reference implementation
(reference), the column names (columns) and the strict reading of a metric table (tables). Below
training: the training loop's recorder imports it."""
