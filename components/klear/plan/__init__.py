"""`klear plan PIPELINE`: the run's settings held against the limits it will meet, on CPU, before any GPU is taken.

shapes.py reads the cluster and model shapes (shipped in shapes/*.yaml, or a YAML file); checks.py holds each check
as a small pure function returning `Check`s; command.py reads the compiled pipeline's parameters, applies `--arg`
and prints the table (text) or `{"checks": [...], "estimates": {...}}` (json). No torch, transformers or vLLM.
"""
