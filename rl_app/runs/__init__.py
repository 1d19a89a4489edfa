"""Run folders: layout and metadata, progress.csv, checkpoints (atomic, marker last), storage and its mirror,
run listing. Imports neither Ray nor torch."""
