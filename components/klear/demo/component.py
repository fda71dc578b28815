"""KFP components of the demo's inputs: the synthetic prompt sources and the tiny base model."""

from kfp import dsl
from kfp.dsl import Dataset, Model, Output

from klear.common.images import CPU_IMAGE, GPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def demo_data(math_count: int, code_count: int, seed: int, run_root: str, run_id: str, data: Output[Dataset]):
    """Synthetic math and code prompt sources (math.jsonl, code.jsonl) with planted duplicates and leaks.

    Args:
        math_count: number of synthetic math problems.
        code_count: number of synthetic code problems.
        seed: seed of the generator; the same seed gives the same files.
        run_root: where stages publish (path or s3://); empty: the KFP artifact store.
        run_id: the pipeline run's id, which names the output folder under run_root.
    """
    from klear.common import kfp_io
    from klear.demo.generate import generate

    target = kfp_io.output_location(data, run_root, run_id, "demo-data")
    summary = generate(target, math_count, code_count, seed)
    kfp_io.record_output(data, target, {"math": summary["math"], "code": summary["code"]})


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def tiny_model(run_root: str, run_id: str, model: Output[Model]):
    """A tiny Qwen3-architecture model and tokenizer, built in code (no model hub).

    Args:
        run_root: where stages publish (path or s3://); empty: the KFP artifact store.
        run_id: the pipeline run's id, which names the output folder under run_root.
    """
    from klear.common import kfp_io
    from klear.demo.tiny_model import build

    target = kfp_io.output_location(model, run_root, run_id, "tiny-model")
    summary = build(target)
    kfp_io.record_output(model, target, {"parameters": summary["parameters"], "vocab": summary["vocab"]})
