"""KFP component that builds the tiny model of the CPU preset (the demo pipeline's base model)."""

from kfp import dsl
from kfp.dsl import Model, Output

from klear.common.images import GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def tiny_model(run_root: str, run_id: str, model: Output[Model]):
    """A tiny Qwen3-architecture model and tokenizer, built in code (no model hub)."""
    from klear.common import kfp_io
    from klear.tiny_model.build import build

    target = kfp_io.output_location(model, run_root, run_id, "tiny-model")
    summary = build(target)
    kfp_io.record_output(model, target, {"parameters": summary["parameters"], "vocab": summary["vocab"]})
