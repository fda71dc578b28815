"""Kubeflow pipelines of the Klear-Reasoner recipe, and their compiler (`make pipeline`)."""
