"""Behaviour hashes: the digest of every message a run config's tiny run (tiny.py) exchanges, so that a record pins
what the code did, not only its commit. Computed in child processes over the code on disk (one process serves many
tiny runs inline) and cached per digest of that code, so a second check is instant and a code change is seen.

    python -m experiments.studies.behaviour CASES.json OUT.json   (the child; CASES: key -> [config, clients])
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from common.storage.persist import atomic_write_text, private_folder
from experiments.studies.tiny import tiny_config, tiny_key

PROJECT = Path(__file__).resolve().parents[2]
# What decides the messages of a run: the apps, the core, the engine that serves them and the tiny run itself.
BEHAVIOUR_CODE = ("common", "server_app", "client_app", "experiments/engine", "experiments/studies")
VERSIONED = ("torch", "numpy", "flwr")
FAILED = "failed"  # a hash's prefix when the tiny run did not finish: such a record is never current

Case = tuple[dict[str, Any], int]  # (tiny run config, tiny clients)


def code_digest(root: Path = PROJECT) -> str:
    """sha256 (short) of every source file that decides a run's messages, as on disk, and the versions of the
    libraries that compute them."""
    digest = hashlib.sha256()
    for part in BEHAVIOUR_CODE:
        for path in sorted((root / part).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for name in VERSIONED:
        try:
            digest.update(f"{name}={metadata.version(name)}\0".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{name}=none\0".encode())
    return digest.hexdigest()[:20]


def cache_folder() -> Path:
    """Where behaviour hashes are cached: $PFL_CACHE_DIR/behaviour (default ~/.cache/pflower/behaviour)."""
    base = Path(os.environ.get("PFL_CACHE_DIR", Path.home() / ".cache" / "pflower")).expanduser()
    return base / "behaviour"


def _read_cache(path: Path) -> dict[str, str]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def cases_of(items: list[tuple[dict[str, Any], int]]) -> dict[str, Case]:
    """key -> tiny case for run configs and their clients (configs today's code refuses are left out: the caller
    sees no hash for them)."""
    from common.hparams import ConfigError

    cases: dict[str, Case] = {}
    for config, clients in items:
        try:
            cases[tiny_key(config, clients)] = tiny_config(config, clients)
        except ConfigError:
            continue
    return cases


def behaviour_hashes(
    cases: dict[str, Case],
    root: Path = PROJECT,
    say: Callable[[str], None] = lambda line: None,
    processes: int = 2,
) -> dict[str, str]:
    """key -> behaviour hash of each tiny case under the code in `root` (cached per code digest; the missing ones
    run in up to `processes` children side by side)."""
    digest = code_digest(root)
    folder = cache_folder()
    path = folder / f"{digest}.json"
    cache = _read_cache(path)
    missing = sorted(k for k in cases if k not in cache)
    if missing:
        started = time.monotonic()
        say(f"behaviour: {len(missing)} tiny run(s) to hash under code {digest} ({len(cases) - len(missing)} cached)")
        cache.update(_run_children({k: cases[k] for k in missing}, root, processes))
        private_folder(folder)
        atomic_write_text(path, json.dumps(_read_cache(path) | cache, indent=1, sort_keys=True))
        say(f"behaviour: hashed in {time.monotonic() - started:.0f} s")
    return {k: cache[k] for k in cases}


def _run_children(cases: dict[str, Case], root: Path, processes: int) -> dict[str, str]:
    """Run the cases in children (grouped by data set, so each child writes few stand-ins)."""
    ordered = sorted(cases, key=lambda k: (str(cases[k][0].get("dataset")), k))
    count = max(1, min(processes, len(ordered)))
    chunks = [ordered[i::count] for i in range(count)]
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="pflower-behaviour-") as tmp:
        children = []
        for index, chunk in enumerate(chunks):
            given, result = Path(tmp) / f"cases-{index}.json", Path(tmp) / f"out-{index}.json"
            given.write_text(json.dumps({k: list(cases[k]) for k in chunk}))
            env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
            command = [sys.executable, "-m", "experiments.studies.behaviour", str(given), str(result)]
            log = open(Path(tmp) / f"log-{index}.txt", "wb")  # the tiny runs' own log lines stay out of the caller's
            children.append((subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=log), result, chunk, log))
        for child, result, chunk, log in children:
            child.wait()
            log.close()
            got = _read_cache(result)
            tail = Path(log.name).read_text(errors="replace").strip().splitlines()[-1:] if child.returncode else []
            why = f"{FAILED}: the hashing process exited {child.returncode}" + (f" ({tail[0][:200]})" if tail else "")
            out.update({k: got.get(k, why) for k in chunk})
    return out


def _hash_run(config: dict[str, Any], clients: int, export: Path, tmp: Path) -> str:
    """The behaviour hash of one tiny run (its messages' digests, sorted), or FAILED with the run's first error."""
    from experiments.benchmarks.measure import message_digests
    from experiments.engine.serve import serve

    errors: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR:
                errors.append(record.getMessage())

    handler = Catch()
    logging.getLogger("flwr").addHandler(handler)
    try:
        run = {**config, "results-dir": str(tmp), "run-name": "run", "message-digests": True}
        finished = serve(run, clients, 0, export, inline=True)
    except Exception as exc:  # a crash of one tiny run is that config's answer, not the check's end
        finished, errors = False, [*errors, f"{type(exc).__name__}: {exc}"]
    finally:
        logging.getLogger("flwr").removeHandler(handler)
    if not finished:
        return f"{FAILED}: {(errors or ['no error logged'])[0]}"[:300]
    digest = hashlib.sha256()
    for row in message_digests(tmp / "run"):
        digest.update(row.encode())
    return digest.hexdigest()[:16]


def main(argv: list[str]) -> int:
    """The child: hash every case of CASES.json into OUT.json (rewritten after each, so a crash keeps the rest)."""
    import torch

    from experiments.run.exports import write_export
    from experiments.studies.tiny import STAND_INS, tiny_dataset, tiny_per_class

    torch.set_num_threads(1)
    logging.getLogger("flwr").setLevel(logging.ERROR)
    cases = json.loads(Path(argv[0]).read_text())
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="pflower-tiny-") as tmp:
        exports: dict[tuple[str, int], Path] = {}
        for index, (key, (config, clients)) in enumerate(cases.items()):
            name = str(config.get("dataset", "digits"))
            if name not in STAND_INS:
                out[key] = f"{FAILED}: no tiny stand-in of data set {name!r} (experiments/studies/tiny.py)"
                continue
            stand_in = (name, tiny_per_class(config))
            if stand_in not in exports:
                data = tiny_dataset(*stand_in)
                exports[stand_in] = Path(tmp) / f"{name}-{stand_in[1]}.npz"
                write_export(data, range(len(data.y)), exports[stand_in])
            run_dir = Path(tmp) / f"run-{index}"
            run_dir.mkdir()
            out[key] = _hash_run(config, int(clients), exports[stand_in], run_dir)
            Path(argv[1]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
