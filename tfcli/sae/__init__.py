"""Sparse autoencoders on a model's hook points: the SAE itself (model.py), its files in SAELens's layout
(files.py) and the hook points it reads and edits (points.py). Shared by the trainer (tfcli.train.sae), the
views (tfcli.inspect.feature_views) and steering (generate); nothing here trains, prints or decodes."""
