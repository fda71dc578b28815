"""A multi-node checkpoint is published only with every node's files: each node uploads what its disk holds and
records it; the world's rank 0 writes the manifest once every node's record of this save is there. Two uploaders
(rank 0's and another node's) on one folder, as the two nodes' background threads run them."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from klear.common import storage
from klear.training import checkpoints

STEP = 4


def _local_checkpoint(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _rank0(tmp_path: Path, wait_s: float) -> checkpoints.CheckpointUploader:
    uploader = checkpoints.CheckpointUploader(str(tmp_path / "out"), tmp_path / "staging-0", keep=2)
    uploader.world_size, uploader.parts_wait_s = 2, wait_s
    return uploader


def _rank0_files(tmp_path: Path) -> Path:
    return _local_checkpoint(tmp_path / "node-0", {"trainer_state.json": "{}", "rng_state_0.pth": "r0",
                                                   "global_step4/zero_pp_rank_0_mp_rank_00_model_states.pt": "p0"})


def _node1_files(tmp_path: Path) -> Path:
    return _local_checkpoint(tmp_path / "node-1", {"rng_state_1.pth": "r1",
                                                   "global_step4/zero_pp_rank_1_mp_rank_00_model_states.pt": "p1"})


def test_published_once_the_other_node_has_uploaded_ignoring_an_earlier_attempts_record(tmp_path: Path) -> None:
    output = str(tmp_path / "out")
    uri = checkpoints.checkpoint_uri(output, STEP)
    # A record an earlier attempt at this step left (its run died before the manifest): not this save's.
    storage.write_bytes(uri.join(f"{checkpoints.PART_PREFIX}1.json"), json.dumps({"token": "earlier", "files": {}}).encode())
    rank0 = _rank0(tmp_path, wait_s=60)
    publishing = threading.Thread(target=rank0._upload, args=(_rank0_files(tmp_path), STEP, "this-save", {1: [1]}))
    publishing.start()
    node1 = checkpoints.CheckpointUploader(output, tmp_path / "staging-1", keep=2)
    node1._upload_part(_node1_files(tmp_path), STEP, "this-save", 1, [1])
    publishing.join(timeout=60)
    rank0.wait()
    node1.wait()
    manifest = storage.read_manifest(uri)
    assert sorted(manifest.files) == ["global_step4/zero_pp_rank_0_mp_rank_00_model_states.pt",
                                      "global_step4/zero_pp_rank_1_mp_rank_00_model_states.pt",
                                      "rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"]
    assert manifest.meta["nodes"] == 2 and manifest.meta["world_size"] == 2
    assert checkpoints.published_steps(output) == [STEP] and rank0.published == [STEP]
    assert not list(Path(uri.path).glob(f"{checkpoints.PART_PREFIX}*"))  # the records went with the manifest
    with storage.fetch_published(uri) as (local, _):  # every listed file is there with its checksum
        assert (local / "rng_state_1.pth").read_text() == "r1"


def test_a_node_that_never_uploads_leaves_the_checkpoint_unpublished(tmp_path: Path) -> None:
    rank0 = _rank0(tmp_path, wait_s=0.5)
    rank0._upload(_rank0_files(tmp_path), STEP, "this-save", {1: [1, 2]})
    with pytest.raises(storage.StorageError, match=r"the files of ranks \[1, 2\] did not arrive within 0 s; the "
                       "checkpoint stays unpublished"):
        rank0.wait()
    assert checkpoints.published_steps(str(tmp_path / "out")) == []


def test_a_node_whose_upload_failed_leaves_the_checkpoint_unpublished(tmp_path: Path) -> None:
    output = str(tmp_path / "out")
    uri = checkpoints.checkpoint_uri(output, STEP)
    (Path(uri.path) / "rng_state_1.pth" / "in-the-way").mkdir(parents=True)  # node 1's upload cannot replace it
    node1 = checkpoints.CheckpointUploader(output, tmp_path / "staging-1", keep=2)
    node1._upload_part(_node1_files(tmp_path), STEP, "this-save", 1, [1])
    with pytest.raises(storage.StorageError, match="checkpoint upload failed"):
        node1.wait()  # the node's training stops too
    rank0 = _rank0(tmp_path, wait_s=30)
    rank0._upload(_rank0_files(tmp_path), STEP, "this-save", {1: [1]})
    with pytest.raises(storage.StorageError, match=r"the node of ranks \[1\] failed to upload its files: .*rng_state_1"):
        rank0.wait()
    assert checkpoints.published_steps(output) == []


def test_two_nodes_holding_one_name_with_other_bytes_is_refused() -> None:
    same = {"latest": {"size": 1, "sha256": "a"}}
    assert checkpoints.merge_parts(same, {1: same}, "ckpt") == same
    with pytest.raises(storage.StorageError, match="ckpt/latest: the node of rank 1 holds other content"):
        checkpoints.merge_parts(same, {1: {"latest": {"size": 1, "sha256": "b"}}}, "ckpt")
    assert checkpoints.node_ranks([0, 0, 2, 2]) == {0: [0, 1], 2: [2, 3]}


def test_zero3_partitions_of_another_process_count_are_refused_before_the_model_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    output = str(tmp_path / "out")
    uri = checkpoints.checkpoint_uri(output, 8)
    storage.publish_dir(_rank0_files(tmp_path), uri, meta={"stage": "sft", "world_size": 2})
    with pytest.raises(ValueError, match=f"the checkpoint {uri} was written by 2 processes and this run has 1: DeepSpeed "
                       "ZeRO partitions cannot be re-split. Run with 2 processes"):
        checkpoints.refuse_other_world_size(output, enabled=True, deepspeed=True)
    checkpoints.refuse_other_world_size(output, enabled=False, deepspeed=True)  # starts afresh: nothing resumes
    checkpoints.refuse_other_world_size(output, enabled=True, deepspeed=False)  # resumes with a warning
    # Launched with as many processes (the launcher's WORLD_SIZE, before any process group exists): resumes.
    monkeypatch.setenv("WORLD_SIZE", "2")
    checkpoints.refuse_other_world_size(output, enabled=True, deepspeed=True)
