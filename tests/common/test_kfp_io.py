"""Where a stage publishes inside a KFP task: `<run_root>/<run id>/<stage>`, the run id from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from klear.common import kfp_io


def test_location_is_stable_across_retries_of_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kfp_io.RUN_ID_ENV, "3f6c0a52")
    first = kfp_io.output_location("s3://bucket/runs/", "sft")
    assert first == kfp_io.output_location("s3://bucket/runs", "sft") == "s3://bucket/runs/3f6c0a52/sft"
    monkeypatch.setenv(kfp_io.RUN_ID_ENV, "another-run")
    assert kfp_io.output_location("s3://bucket/runs", "sft") != first


def test_missing_run_id_or_run_root_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kfp_io.RUN_ID_ENV, raising=False)
    with pytest.raises(RuntimeError, match="KLEAR_RUN_ID is not set"):
        kfp_io.output_location("s3://bucket/runs", "curate")
    monkeypatch.setenv(kfp_io.RUN_ID_ENV, "r")
    with pytest.raises(ValueError, match="run_root is empty"):
        kfp_io.output_location("  ", "curate")


def test_a_task_stages_on_its_scratch_volume_where_it_has_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """KLEAR_SCRATCH (the pipeline's scratch volume) becomes tempfile's folder, so storage's staging and a downloaded
    model go there; under kfp.local, where no volume is mounted, the folder is missing and /tmp stays."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setenv("KLEAR_SCRATCH", str(tmp_path / "missing"))
    assert kfp_io.use_scratch() == tempfile.gettempdir() != str(tmp_path / "missing")
    monkeypatch.setenv("KLEAR_SCRATCH", str(tmp_path))
    assert kfp_io.use_scratch() == str(tmp_path)
    with tempfile.TemporaryDirectory() as staging:
        assert Path(staging).parent == tmp_path
