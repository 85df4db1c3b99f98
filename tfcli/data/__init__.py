"""Token shards and labeled data sets: from text (read by `tfcli.corpus`) to what training batches read."""
