"""Training checkpoints on object storage: publish every N steps, resume from the newest complete one.

Layout: `<output>/checkpoints/step-000000120/` holds one Trainer checkpoint (model, optimizer,
scheduler, RNG states, trainer_state.json with the step and epoch, from which the Trainer finds
its data-loader position) and a `_MANIFEST.json` written last. A checkpoint without a manifest
was cut off mid-upload and is ignored.

Uploads run in a background thread from a hard-linked snapshot of the local checkpoint, so the
Trainer keeps training (and may rotate its local copies) while the upload goes on; only the next
checkpoint waits for the previous upload. Each node's first process uploads what its node's disk
holds (on one node: everything; on several: the node's ranks' ZeRO-3 partitions and RNG states, the
world's rank 0 also the weights and trainer state). The other nodes then record their files in a
`_PART-<rank>.json` beside them, and the world's rank 0 writes the manifest only once every node's
record of this save is there: a checkpoint is complete with every rank's files, or not at all.

Resuming needs the number of processes that wrote the checkpoint when it holds DeepSpeed ZeRO
partitions (they cannot be re-split); another number is refused by name, and a new run can start
from the checkpoint's Hugging Face weights instead. Without DeepSpeed it resumes with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from klear.common import lineage, storage
from klear.training.hf_model import launched_processes

log = logging.getLogger("klear.checkpoints")

CHECKPOINTS = "checkpoints"
META_FILE = "klear_checkpoint.json"  # the manifest's meta (step, world size), kept beside a downloaded checkpoint
TENSORBOARD = "tensorboard"  # the TensorBoard logs so far, so curves continue across restarts
_STEP_DIR = re.compile(r"^step-(\d+)$")
PART_PREFIX = "_PART-"  # `_PART-<first rank of a node>.json`: the files that node uploaded into a checkpoint
PARTS_WAIT_S = 3600.0  # rank 0 gives a checkpoint up, unpublished, when another node's files take longer
PARTS_POLL_S = 1.0


def checkpoint_uri(output: str, step: int) -> storage.Uri:
    return storage.Uri.parse(output).join(CHECKPOINTS, f"step-{step:09d}")


def complete_steps(names: list[str]) -> list[int]:
    """Steps whose checkpoint folder has a manifest, given the file names under the checkpoints prefix."""
    steps = []
    for name in names:
        folder, _, rest = name.partition("/")
        match = _STEP_DIR.match(folder)
        if match and rest == storage.MANIFEST_NAME:
            steps.append(int(match.group(1)))
    return sorted(steps)


def published_steps(output: str) -> list[int]:
    """Complete checkpoints under `<output>/checkpoints`, oldest first; [] when the prefix is missing or unreadable."""
    prefix = storage.Uri.parse(output).join(CHECKPOINTS)
    try:
        return complete_steps(storage.list_files(prefix))
    except (storage.StorageError, OSError) as exc:
        log.warning("cannot list checkpoints under %s (%s): starting from scratch", prefix, exc)
        return []


def fetch_checkpoint(output: str, step: int, local_root: Path) -> Path | None:
    """Download checkpoint `step` to `<local_root>/checkpoint-<step>` (where the Trainer expects it); None if unreadable."""
    target = local_root / f"checkpoint-{step}"
    shutil.rmtree(target, ignore_errors=True)
    try:
        with storage.fetch_published(checkpoint_uri(output, step)) as (local, manifest):
            shutil.copytree(local, target, ignore=shutil.ignore_patterns(storage.MANIFEST_NAME))
            (target / META_FILE).write_text(json.dumps(manifest.meta))
    except (storage.StorageError, OSError) as exc:
        log.warning("checkpoint step %d at %s is unreadable (%s)", step, checkpoint_uri(output, step), exc)
        shutil.rmtree(target, ignore_errors=True)
        return None
    return target


def newest_checkpoint(output: str, local_root: Path) -> Path | None:
    """The newest complete, readable checkpoint, downloaded; None means: start from scratch."""
    for step in reversed(published_steps(output)):
        path = fetch_checkpoint(output, step, local_root)
        if path is not None:
            return path
    return None


def world_size_problem(written_by: int | None, now: int, deepspeed: bool,
                       checkpoint: str = "<output>/checkpoints/step-N") -> tuple[str, str] | None:
    """("error" | "warning", message) when resuming `checkpoint` written by another number of processes."""
    if written_by is None or written_by == now:
        return None
    if deepspeed:
        return "error", (f"the checkpoint {checkpoint} was written by {written_by} processes and this run has {now}: "
                         f"DeepSpeed ZeRO partitions cannot be re-split. Run with {written_by} processes, or start a "
                         f"new run (another --output) from the checkpoint's Hugging Face weights: --model {checkpoint}")
    return "warning", (f"the checkpoint {checkpoint} was written by {written_by} processes and this run has {now}: "
                       "optimizer and schedule resume, the data position is recomputed from the optimizer step for "
                       "the new batch size")


def refuse_other_world_size(output: str, enabled: bool, deepspeed: bool) -> None:
    """Raise ValueError in a run's first seconds when it would resume ZeRO partitions written by another number of
    processes (resume_point checks the checkpoint it downloads again)."""
    if not (enabled and deepspeed):
        return
    steps = published_steps(output)
    if not steps:
        return
    newest = checkpoint_uri(output, steps[-1])
    try:
        meta = storage.read_manifest(newest).meta
    except (storage.StorageError, OSError):
        return  # resume_point decides what an unreadable checkpoint means
    problem = world_size_problem(meta.get("world_size"), launched_processes(), deepspeed, str(newest))
    if problem and problem[0] == "error":
        raise ValueError(problem[1])


def resume_point(output: str, trainer_dir: Path, work: Path, enabled: bool, deepspeed: bool,
                 fingerprint: dict[str, str] | None = None) -> Path | None:
    """The newest complete checkpoint, downloaded once per node by its local main process; every rank gets its
    path. Raises ValueError when the checkpoint is of another run (its fingerprint differs: other model, data
    or config) or when DeepSpeed partitions would have to be re-split. Not `enabled`: existing checkpoints
    are deleted (asked to start afresh, and an old run's later steps must never be resumed by mistake)."""
    from accelerate import PartialState

    from klear.training.fingerprint import differing_parts, mismatch_message

    state = PartialState()
    marker = work / "resume.json"
    if state.is_local_main_process:
        found, error = None, None
        # Local checkpoints left by an earlier run in this pod are stale: storage decides what resumes.
        for stale in trainer_dir.glob("checkpoint-*"):
            shutil.rmtree(stale, ignore_errors=True)
        steps = published_steps(output)
        if not enabled:
            for step in steps:
                log.warning("resume=false: deleting checkpoint step %d of an earlier run in %s", step, output)
                delete_checkpoint(output, step)
        elif steps:
            newest = checkpoint_uri(output, steps[-1])
            meta = storage.read_manifest(newest).meta
            parts = differing_parts(meta.get("fingerprint"), fingerprint) if fingerprint is not None else None
            error = mismatch_message(output, parts) if parts else None
            # Refused before a download of every rank's partitions.
            problem = world_size_problem(meta.get("world_size"), launched_processes(), deepspeed, str(newest))
            if error is None and problem and problem[0] == "error":
                error = problem[1]
        if enabled and error is None:
            found = newest_checkpoint(output, trainer_dir)
        marker.write_text(json.dumps({"path": str(found) if found else None, "error": error}))
    state.wait_for_everyone()
    decided = json.loads(marker.read_text())
    if decided["error"]:
        raise ValueError(decided["error"])
    path = decided["path"]
    if not path:
        return None
    meta = json.loads((Path(path) / META_FILE).read_text())
    problem = world_size_problem(meta.get("world_size"), launched_processes(), deepspeed,
                                 str(checkpoint_uri(output, int(Path(path).name.split("-")[-1]))))
    if problem and problem[0] == "error":
        raise ValueError(problem[1])
    if problem:
        log.warning(problem[1])
    return Path(path)


def delete_checkpoint(output: str, step: int) -> None:
    """Manifest first (after a record naming its files), so a deletion cut short leaves an incomplete checkpoint the
    stage knows as its own, never a wrong complete one (storage.withdraw)."""
    uri = checkpoint_uri(output, step)
    storage.withdraw(uri)
    if not uri.is_s3:  # a local folder tree outlives its files (S3 has no folders)
        remove_empty_folders(Path(uri.path))


def remove_empty_folders(root: Path) -> None:
    """`root` and the folders under it that hold no file, deepest first; a folder that holds one stays."""
    if not root.is_dir():
        return
    for folder in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    if not any(root.iterdir()):
        root.rmdir()


def _snapshot(source: Path, target: Path) -> None:
    """Hard links where the filesystem allows (no copy of a multi-GB optimizer state), copies elsewhere."""
    for path in source.rglob("*"):
        dest = target / path.relative_to(source)
        if path.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, dest)
        except OSError:
            shutil.copy2(path, dest)


def node_ranks(first_rank_of: list[int]) -> dict[int, list[int]]:
    """Node (named by its first global rank) -> its ranks, given the first rank of every rank's node."""
    nodes: dict[int, list[int]] = {}
    for rank, first in enumerate(first_rank_of):
        nodes.setdefault(first, []).append(rank)
    return nodes


def merge_parts(own: dict[str, dict[str, Any]], parts: dict[int, dict[str, dict[str, Any]]],
                where: str) -> dict[str, dict[str, Any]]:
    """A checkpoint's files: the publishing node's and every other node's (by first rank). A file two nodes
    hold must be the same bytes: the object holds whichever upload came last."""
    merged = dict(own)
    for first, files in sorted(parts.items()):
        for name, entry in files.items():
            if name in merged and merged[name]["sha256"] != entry["sha256"]:
                raise storage.StorageError(f"{where}/{name}: the node of rank {first} holds other content under this "
                                           "name than another node; the checkpoint is not published")
            merged[name] = entry
    return merged


def _agree(rank: int, local_rank: int) -> tuple[str, dict[int, list[int]]]:
    """Rank 0's token for this save (a node's record of an earlier attempt at the same step is not taken for
    this one's) and the ranks of every node; a collective, so every rank calls it."""
    import torch.distributed as dist

    token, first = uuid.uuid4().hex, rank - local_rank  # torchrun numbers a node's processes consecutively
    if not (dist.is_available() and dist.is_initialized()):
        return token, {first: [rank]}
    box = [token]
    dist.broadcast_object_list(box, src=0)
    firsts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(firsts, first)
    return box[0], node_ranks(firsts)


class CheckpointUploader(TrainerCallback):
    """Publishes each local Trainer checkpoint to `<output>/checkpoints/step-N` in the background."""

    def __init__(self, output: str, staging: Path, keep: int, tensorboard: Any = None, stage: str = "sft",
                 fingerprint: dict[str, str] | None = None, made_from: lineage.RunLineage | None = None) -> None:
        self.stage = stage
        self.made_from = made_from  # the run's inputs: each checkpoint's lineage (None: it records none)
        self.fingerprint = fingerprint  # what the run is of (klear.training.fingerprint), checked on resume
        self.world_size = 1
        self.tensorboard = tensorboard  # rank 0's SummaryWriter, or None
        self.output = output
        self.staging = staging
        self.keep = keep
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.published: list[int] = []
        self.parts_wait_s = PARTS_WAIT_S

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # every rank has written its part of the checkpoint
        rank, local_rank = getattr(args, "process_index", 0), getattr(args, "local_process_index", 0)
        token, nodes = _agree(rank, local_rank)
        if local_rank != 0:
            return  # the node's first process uploads what the node's disk holds
        self.wait()
        self.world_size = args.world_size
        step = state.global_step
        snapshot = self.staging / f"step-{step}"
        shutil.rmtree(snapshot, ignore_errors=True)
        _snapshot(Path(args.output_dir) / f"checkpoint-{step}", snapshot)
        if not state.is_world_process_zero:
            self._thread = threading.Thread(target=self._upload_part, args=(snapshot, step, token, rank, nodes[rank]),
                                            name=f"upload-step-{step}", daemon=True)
            self._thread.start()
            return
        if self.tensorboard is not None:
            self.tensorboard.flush()  # copied, not linked: the writer keeps appending to its file
            shutil.rmtree(snapshot / TENSORBOARD, ignore_errors=True)  # a resumed checkpoint's copy is older
            shutil.copytree(self.tensorboard.log_dir, snapshot / TENSORBOARD)
        others = {first: ranks for first, ranks in nodes.items() if first != rank}
        self._thread = threading.Thread(target=self._upload, args=(snapshot, step, token, others),
                                        name=f"upload-step-{step}", daemon=True)
        self._thread.start()

    def _upload_part(self, snapshot: Path, step: int, token: str, first: int, ranks: list[int]) -> None:
        """Another node's share: its files, then its record of them, which rank 0 waits for."""
        uri = checkpoint_uri(self.output, step)
        record: dict[str, Any] = {"token": token, "ranks": ranks}
        try:
            files = storage.file_entries(snapshot)
            # Named before they go up: after a crash the next run of the stage knows them as its own.
            storage.note_pending(uri, f"{token}-ranks-{first}", self.stage,
                                 files=[*files, f"{PART_PREFIX}{first}.json"])
            storage.delete(uri.join(storage.MANIFEST_NAME))  # an earlier publish of this step is not complete now
            for name in files:
                storage.upload_file(snapshot / name, uri.join(name))
            record["files"] = files
            log.info("checkpoint step %d: the files of ranks %s uploaded to %s", step, ranks, uri)
        except BaseException as exc:  # noqa: BLE001 (recorded for rank 0, surfaced here by wait())
            self._error, record["error"] = exc, str(exc)[:500]
        try:
            storage.write_bytes(uri.join(f"{PART_PREFIX}{first}.json"), json.dumps(record).encode())
        except BaseException as exc:  # noqa: BLE001 (surfaced on the training thread by wait())
            self._error = self._error or exc
        finally:
            shutil.rmtree(snapshot, ignore_errors=True)

    def _await_parts(self, uri: storage.Uri, token: str, others: dict[int, list[int]]) -> dict[int, dict[str, Any]]:
        """The other nodes' files of this save, once each has recorded them; raises on a node's failure or when
        one takes longer than `parts_wait_s` (the checkpoint then stays unpublished)."""
        deadline = time.monotonic() + self.parts_wait_s
        parts: dict[int, dict[str, Any]] = {}
        while True:
            for first in sorted(others.keys() - parts.keys()):
                record_uri = uri.join(f"{PART_PREFIX}{first}.json")
                if not storage.exists(record_uri):
                    continue
                record = json.loads(storage.read_bytes(record_uri))
                if record.get("token") != token:
                    continue  # left by an earlier attempt at this step
                if record.get("error"):
                    raise storage.StorageError(f"{uri}: the node of ranks {others[first]} failed to upload its files: "
                                               f"{record['error']}")
                parts[first] = record["files"]
            if len(parts) == len(others):
                return parts
            if time.monotonic() > deadline:
                missing = sorted(r for first in others.keys() - parts.keys() for r in others[first])
                raise storage.StorageError(f"{uri}: the files of ranks {missing} did not arrive within "
                                           f"{self.parts_wait_s:.0f} s; the checkpoint stays unpublished")
            time.sleep(PARTS_POLL_S)

    def _upload(self, snapshot: Path, step: int, token: str = "", others: dict[int, list[int]] | None = None) -> None:
        try:
            uri = checkpoint_uri(self.output, step)
            meta = {"stage": self.stage, "global_step": step, "world_size": self.world_size,
                    "nodes": 1 + len(others or {}), "fingerprint": self.fingerprint}
            if self.made_from is not None:  # the run's inputs, digested at its first checkpoint; no config
                meta["lineage"] = self.made_from.record(with_config=False)

            def complete(own: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
                return merge_parts(own, self._await_parts(uri, token, others), str(uri)) if others else own

            storage.publish_dir(snapshot, uri, meta=meta, complete=complete)
            log.info("checkpoint step %d published to %s", step, checkpoint_uri(self.output, step))
            self.published.append(step)
            for old in published_steps(self.output)[: -self.keep]:
                delete_checkpoint(self.output, old)
        except BaseException as exc:  # noqa: BLE001 (surfaced on the training thread by wait())
            self._error = exc
        finally:
            shutil.rmtree(snapshot, ignore_errors=True)

    def wait(self) -> None:
        """Block until the upload in flight is done; re-raise its failure (training must not go on unprotected)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise storage.StorageError(f"checkpoint upload failed: {error}") from error

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.wait()


def save_due(elapsed_s: float, save_minutes: float) -> bool:
    """Whether a checkpoint is due by time: `save_minutes` (0: never by time) since the last one, or the start."""
    return save_minutes > 0 and elapsed_s >= 60 * save_minutes


class TimedCheckpoints(TrainerCallback):
    """Asks the Trainer to save once `save_minutes` have passed since the last checkpoint (or the start), beside
    its save_steps: a preempted run then loses minutes, not the hours between step checkpoints at 32K. Rank 0's
    clock decides for every rank (a broadcast each optimizer step): a save is collective under DeepSpeed, so the
    ranks must agree."""

    def __init__(self, save_minutes: float) -> None:
        self.save_minutes = save_minutes
        self.last = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        due = save_due(time.monotonic() - self.last, self.save_minutes)
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            import torch

            flag = torch.tensor([int(due)], device=args.device)
            dist.broadcast(flag, src=0)
            due = bool(flag.item())
        if due:
            control.should_save = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.last = time.monotonic()


def train_resumable(trainer: Any, output: str, work: Path, resume: Path | None, keep: int, stage: str,
                    fingerprint: dict[str, str] | None = None, save_minutes: float = 0.0, *,
                    made_from: lineage.RunLineage) -> tuple[Any, list[int]]:
    """Run `trainer` from `resume` (or from scratch) with TensorBoard logs under `work/logs` (continued from the
    checkpoint's) and checkpoints published to `<output>/checkpoints` (every save_steps, and every `save_minutes`),
    each recording the run's inputs (`made_from`) as its lineage; returns TrainOutput and published steps."""
    from torch.utils.tensorboard import SummaryWriter
    from transformers.integrations import TensorBoardCallback

    writer = None
    if trainer.is_world_process_zero():
        if resume and (resume / TENSORBOARD).is_dir():  # the curves so far, from before the restart
            shutil.copytree(resume / TENSORBOARD, work / "logs", dirs_exist_ok=True)
        writer = SummaryWriter(log_dir=str(work / "logs"))
        trainer.add_callback(TensorBoardCallback(tb_writer=writer))
    uploader = CheckpointUploader(output, work / "staging", keep, writer, stage, fingerprint, made_from)
    trainer.add_callback(uploader)
    if save_minutes:
        trainer.add_callback(TimedCheckpoints(save_minutes))
    if resume:
        log.info("resuming from checkpoint %s", resume.name)
    else:
        log.info("no complete checkpoint under %s: training from scratch", storage.Uri.parse(output).join(CHECKPOINTS))
    result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    uploader.wait()
    return result, uploader.published
