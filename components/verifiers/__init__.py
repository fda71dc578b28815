"""Verifiers shared by rl_filter, gppo and evaluate: math answer checking and sandboxed code execution."""
