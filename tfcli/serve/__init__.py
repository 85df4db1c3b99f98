"""`tfcli serve`: a run behind OpenAI's HTTP API (completions, chat, models), a chat page and the attention
view of each exchange, with many clients decoded together (continuous batching over one KV cache)."""
