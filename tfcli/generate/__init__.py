"""Text generation: decoding strategies over the KV cache (greedy, sampling, beam search), streaming
detokenization, stop strings, fill-mask and classification. The CLI renders what this package yields."""
