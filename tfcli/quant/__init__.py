"""Quantized weights, a storage type: llama.cpp's block formats (formats.py), which type each tensor of a run
gets (mix.py), a run directory's quantized tensors read with every check first (tensors.py) and the linear
layer over them (linear.py) that the loader attaches for decoding. Knows nothing of the model's code."""
