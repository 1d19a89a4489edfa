"""The one algorithm RLlib does not run: tabular Q-learning (numpy; no Ray, no torch)."""
