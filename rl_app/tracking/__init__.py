"""MLflow tracking: params, metrics per iteration and artifacts of runs and sweeps; a server that is
down or slow never stops or slows a run."""
