"""Training: state, update, checkpoints, metrics, the train and eval CLIs."""
