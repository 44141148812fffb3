"""Run records: one compact, self-describing gzipped JSON per finished run of a study (config and seed, the code that
made it and its behaviour hash, the data set's fingerprint, per-round metrics, the summary with every client's final
accuracies, the algorithm's small arrays, wall time and machine), committed beside the study's documents so that
the study outlives the machine its runs were made on. A record reads back as the run it came from."""

from __future__ import annotations

import datetime
import functools
import hashlib
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from common.hparams import ConfigError
from common.storage.run_folder import (
    RoundRecord,
    RunFolder,
    Summary,
    evaluation,
    read_run_record,
    write_run_record,
)
from experiments.analysis.collect import Run
from experiments.run.cpu_share import CpuShare

SCHEMA = 1
RECORD_SUFFIX = ".json.gz"
MAX_ARRAY_ELEMENTS = 20_000  # the algorithm's arrays kept in a record (FedAMP's 100 x 100 attention); larger: dropped
MACHINE_KEYS = ("data-dir", "results-dir", "run-name", "resume", "client-state-dir", "mlflow-uri")  # not the study's


@dataclass(frozen=True)
class CodeInfo:
    """The code that made a run: its commits (attempts in order, '+changes' for uncommitted edits) and the behaviour
    hash of its config under that code (experiments/studies/behaviour.py)."""

    commits: list[str]
    behaviour: str


def records_folder(sweep_file: Path, name: str, root: Path | None = None) -> Path:
    """Where a study's records are committed: docs/claims/<sweep name>/runs/ of the repository the file is in."""
    base = root if root is not None else repository_root(Path(sweep_file))
    return base / "docs" / "claims" / name / "runs"


def repository_root(path: Path) -> Path:
    """The repository a sweep file belongs to: the first folder above it with a pyproject.toml and a docs/ (its
    records and documents go there), else the working folder."""
    for folder in [path.resolve().parent, *path.resolve().parents]:
        if (folder / "pyproject.toml").is_file() and (folder / "docs").is_dir():
            return folder
    return Path.cwd()


def record_path(folder: Path, run_name: str) -> Path:
    """A run's record file in a study's records folder."""
    return folder / f"{run_name}{RECORD_SUFFIX}"


@functools.lru_cache(maxsize=8)
def data_fingerprint(name: str, data_dir: str) -> str:
    """sha256 (short) of a data set's arrays as the run read them (samples, labels, domains, natural ids)."""
    from common.data.datasets import load_dataset

    data = load_dataset(name, data_dir)
    digest = hashlib.sha256(name.encode())
    for part in (data.x, data.y, data.domain, data.natural_id):
        if part is not None:
            digest.update(str(part.dtype).encode() + str(part.shape).encode())
            digest.update(np.ascontiguousarray(part).tobytes())
    return digest.hexdigest()[:20]


def _machine() -> dict[str, Any]:
    import torch

    return {
        "system": f"{platform.system()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "",
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def _compact_round(record: RoundRecord, keep_clients: bool) -> dict[str, Any]:
    """A round without the per-client bytes, and without per-client evaluations unless `keep_clients`."""
    out = {k: v for k, v in record.items() if k != "bytes_per_client"}
    for key in ("eval", "unseen"):
        found = out.get(key)
        if isinstance(found, dict) and not keep_clients:
            out[key] = {k: v for k, v in found.items() if k != "per_client"}
    return out


def _arrays(artifacts: dict[str, np.ndarray]) -> dict[str, Any]:
    kept = {}
    for name, array in artifacts.items():
        if array.size <= MAX_ARRAY_ELEMENTS and array.dtype.kind in "biuf":
            kept[name] = {"dtype": str(array.dtype), "shape": list(array.shape), "values": array.ravel().tolist()}
    return kept


def make_record(run_dir: Path, study: str, experiment: str, clients: int, code: CodeInfo, data: str) -> dict[str, Any]:
    """The record of a finished run folder."""
    folder = RunFolder(run_dir)
    if not folder.finished():
        raise ConfigError(f"{run_dir} has not finished (no summary): nothing to record")
    config = {k: v for k, v in folder.config().items() if k not in MACHINE_KEYS}
    rounds = folder.rounds()
    last_eval = max((r["round"] for r in rounds if evaluation(r)), default=None)
    summary = folder.summary()
    return {
        "schema": SCHEMA,
        "study": study,
        "name": run_dir.name,
        "experiment": experiment,
        "seed": int(config.get("seed", 0)),
        "clients": clients,
        "config": config,
        "code": {"commits": code.commits, "dirty": any(c.endswith("+changes") for c in code.commits)},
        "behaviour": code.behaviour,
        "data": {"name": config.get("dataset"), "fingerprint": data},
        "rounds": [_compact_round(r, r["round"] == last_eval) for r in rounds],
        "summary": summary,
        "arrays": _arrays(folder.artifacts()),
        "wall_seconds": float(summary.get("wall_seconds", 0.0)),
        "machine": {**_machine(), **({"cpu": cpu} if (cpu := folder.cpu()) is not None else {})},
        "finished": datetime.datetime.fromtimestamp(folder.summary_path.stat().st_mtime, datetime.UTC).isoformat(
            timespec="seconds"
        ),
    }


def write_record(path: Path, record: dict[str, Any]) -> Path:
    """Write a record (gzipped JSON, the same bytes for the same record)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_run_record(path, record)
    return path


def read_record(path: Path) -> dict[str, Any]:
    """A record read back and checked (ConfigError naming the file when it is not one this code reads)."""
    try:
        record = read_run_record(path)
    except (OSError, ValueError, EOFError) as exc:
        raise ConfigError(f"{path} is not a readable run record: {exc}") from None
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        found = record.get("schema") if isinstance(record, dict) else None
        raise ConfigError(f"{path}: run record schema {found!r}, this code reads schema {SCHEMA}")
    missing = [k for k in ("name", "config", "rounds", "summary", "behaviour", "clients") if k not in record]
    if missing:
        raise ConfigError(f"{path}: run record lacks {missing}")
    return record


def record_arrays(record: dict[str, Any]) -> dict[str, np.ndarray]:
    """The algorithm's arrays a record kept."""
    return {
        name: np.asarray(item["values"], dtype=item["dtype"]).reshape(item["shape"])
        for name, item in record.get("arrays", {}).items()
    }


def as_run(record: dict[str, Any], folder: Path) -> Run:
    """The record as the finished run the documents read (its path: folder/<run name>, as a run folder's)."""
    return Run(
        folder / str(record["name"]),
        dict(record["config"]),
        cast(Summary, record["summary"]),
        cast(list[RoundRecord], record["rounds"]),
        arrays=record_arrays(record),
        commits=list(record.get("code", {}).get("commits", [])),
        finished=str(record.get("finished", "")),
        machine=machine_text(record.get("machine", {})),
        cpu=CpuShare.from_dict(record.get("machine", {}).get("cpu")),
    )


def machine_text(machine: dict[str, Any]) -> str:
    """A record's machine in words, as the documents show it."""
    if not machine:
        return "an unrecorded machine"
    return (
        f"{machine.get('system', '?')}, {machine.get('cpus', '?')} CPUs, {machine.get('gpu') or 'no GPU'}, "
        f"Python {machine.get('python', '?')}, torch {machine.get('torch', '?')}"
    )


def read_records(folder: Path) -> dict[str, dict[str, Any]]:
    """run name -> record, for every record in a study's records folder (empty when it has none)."""
    if not folder.is_dir():
        return {}
    found = {}
    for path in sorted(folder.glob(f"*{RECORD_SUFFIX}")):
        record = read_record(path)
        found[str(record["name"])] = record
    return found
