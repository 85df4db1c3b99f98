"""Training: objectives, data, the optimizer and schedule, checkpoints that resume exactly, and the loop."""
