"""Serving a published model: a KServe InferenceService whose predictor runs vLLM's OpenAI-compatible server.

    manifest.py   the InferenceService (pure): the chart renders the same object, the pipeline applies it
    fetch.py      `python -m klear.serve.fetch URI DIR`: the files a published output's manifest lists, verified
    deploy.py     create-or-replace through the Kubernetes API (server-side apply), then wait until it serves
    component.py  the pipeline step that serves the recipe's final model
"""
