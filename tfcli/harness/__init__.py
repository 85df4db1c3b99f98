"""EleutherAI's lm-evaluation-harness on tfcli runs: the harness's model API over a run (`model.py`, registered
as `tfcli`), its task registry with tfcli's own small tasks (`tasks.py`, `tasks/`), and the runs (`evaluate.py`).
Everything here imports lm_eval, which is heavy and optional (the `eval` extra): only `tfcli eval --tasks` loads it."""
