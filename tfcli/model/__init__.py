"""The transformer family: config (torch-free), attention, positions, blocks, and the three architectures."""
