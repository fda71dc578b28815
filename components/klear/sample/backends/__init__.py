"""Sampling backends behind one interface: `generate(requests)` yields one Completion per request, in any order.

openai_api (an OpenAI-compatible endpoint), vllm_engine (vLLM offline on the pod's GPUs), hf (transformers on
CPU: tests and the demo), shipped (responses the records already hold). Only the module of the backend in use
is imported; torch and vllm only inside the local engines' functions.
"""
