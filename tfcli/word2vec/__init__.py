"""word2vec (skip-gram and CBOW with negative sampling) in C, the corpus statistics it draws from, and its run
directory; the training loop that drives it is `tfcli.train.word2vec`, the explorer `tfcli.inspect.embeddings`."""
