"""KFP component that generates the synthetic demo sources."""

from kfp import dsl
from kfp.dsl import Dataset, Output

from klear.common.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def demo_data(math_count: int, code_count: int, seed: int, run_root: str, run_id: str, data: Output[Dataset]):
    """Synthetic math and code prompt sources (math.jsonl, code.jsonl) with planted duplicates and leaks."""
    from klear.common import kfp_io
    from klear.demo.generate import generate

    target = kfp_io.output_location(data, run_root, run_id, "demo-data")
    summary = generate(target, math_count, code_count, seed)
    kfp_io.record_output(data, target, {"math": summary["math"], "code": summary["code"]})
