"""Looking inside attention: capture the weights of every layer and head (through the model's explicit
attention path, never a second copy of the math), summarise heads, and render them for a terminal, a
self-contained HTML page, a PNG or JSON."""
