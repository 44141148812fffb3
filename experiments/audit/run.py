"""`pflower privacy`: the leakage audit.

Each attacked client trains the model the round started from on a batch of its data for `steps` SGD steps. It
then uploads the update in one of the wire forms the algorithms use:
- `dense`: every coordinate (FedAvg);
- `sparse:D`: the coordinates of a mask of density D on every prunable layer, as DM-PFL's and FedDST's uploads
  carry (a magnitude mask of the starting weights: what a server can know);
- `body` / `head`: only those layers (FedPer and FedRep send the body, LG-FedAvg the head);
- `pruned:R`: DapperFL's upload at pruning ratio R: the client trains the model with the channels of lowest l1
  norm (of the starting weights) removed, and sends the kept channels' entries; the server knows which were kept
  (the upload names them);
- `trained:dmpfl` / `trained:feddst`: what a real DM-PFL or FedDST client sends after its real local training of
  round 1 (experiments/audit/trained.py): the sparse network it trains from theta_g, its values on its own mask,
  read by the server's own decoding; the attack simulates training on that mask;
- `secure:N`: the server's view under secure aggregation (run-config `secagg`): the sum of N clients' dense
  uploads, each from its own batch. The server knows N, so it attacks the mean update as one client's update on
  the union of the N batches (exact for one local step, where the mean of N batches' mean gradients is the union's;
  an approximation beyond), reading the labels as counts (`label_counts`: the union repeats labels) and scoring
  the best match over every image of the union.
The server runs iDLG for the labels, then Inverting Gradients or DLG on what it saw. The results are PSNR and SSIM
per image (best match) and label accuracy, as a mean and 95% interval over the attacked clients and seeds: a
markdown table (`audit.md`, `audit.json`) and a figure of true images beside their reconstructions
(`reconstructions.png`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from common.config import parse_run_config
from common.data.federated import dataset_for
from common.hparams import ConfigError
from common.learning.models import build_model
from common.methods.channels import channel_groups, entry_indices, recover, take
from common.methods.dapperfl import select_channels
from common.methods.masks import prunable_names
from common.methods.privacy import local_dp_update
from common.storage.persist import atomic_write_text
from experiments.analysis.stats import fmt_ci, mean_ci
from experiments.audit.attacks import (
    Attack,
    KnownRound,
    Masks,
    Trace,
    idlg_labels,
    invert,
    label_counts,
    local_update,
    observed,
)
from experiments.audit.scores import image_scores, label_accuracy
from experiments.audit.trained import TRAINED, TrainedRound, trained_round

UPLOADS = ("dense", "sparse", "body", "head", "pruned", "trained", "secure")
FORMS = (
    "dense, sparse:DENSITY (e.g. sparse:0.1), body, head, pruned:RATIO (e.g. pruned:0.5), "
    + ", ".join(f"trained:{a}" for a in TRAINED)
    + ", secure:N (the sum of N clients' uploads, e.g. secure:8)"
)


@dataclass(frozen=True)
class Row:
    """One cell of the audit: an upload form, batch size, attack; per attacked batch its scores."""

    upload: str
    batch: int
    method: str
    psnr: list[float]
    ssim: list[float]
    labels: list[float]
    seconds: list[float]
    traces: list[Trace] = field(default_factory=list)  # per attacked batch: how its inversion ran

    @property
    def unmoved(self) -> int:
        """Attacked batches whose inversion did not move from its seeded start (not scored)."""
        return sum(not t.moved for t in self.traces)


def pruned_masks(model: torch.nn.Module, params: dict[str, torch.Tensor], ratio: float) -> Masks:
    """DapperFL's upload at pruning ratio `ratio`: per parameter the entries of the kept channels (l1 selection on
    the starting weights, common/methods/dapperfl.select_channels); None where pruning does not touch it."""
    groups = channel_groups(model)
    state = {name: value.numpy() for name, value in params.items()}
    indices = entry_indices(
        groups, select_channels(state, groups, ratio), [(n, tuple(v.shape)) for n, v in state.items()]
    )
    masks: dict[str, torch.Tensor | None] = {}
    for name, value in params.items():
        dims = indices.get(name, {})
        empty = np.zeros(tuple(value.shape), dtype=np.float32)  # the kept entries put back in place (Eq. 6) are 1
        keep = recover(np.ones_like(take(empty, dims)), empty, dims) > 0
        masks[name] = None if keep.all() else torch.from_numpy(keep)
    return masks


def upload_masks(
    upload: str, params: dict[str, torch.Tensor], prunable: list[str], model: torch.nn.Module | None = None
) -> Masks:
    """What an upload form carries of each parameter (see the module's docstring; `pruned` needs the model)."""
    if upload.startswith("pruned:") and model is not None:
        return pruned_masks(model, params, float(upload.split(":", 1)[1]))
    if upload == "dense":
        return dict.fromkeys(params)
    if upload in ("body", "head"):
        return {name: None for name in params if name.startswith(f"{upload}.")}
    if upload.startswith("sparse:"):
        density = float(upload.split(":", 1)[1])
        masks: dict[str, torch.Tensor | None] = {}
        for name, value in params.items():
            if name in prunable:
                keep = max(1, round(density * value.numel()))
                threshold = value.abs().reshape(-1).kthvalue(value.numel() - keep + 1).values
                masks[name] = value.abs() >= threshold
            else:
                masks[name] = None
        return masks
    raise ConfigError(f"upload {upload!r}: one of {FORMS}")


def check_uploads(uploads: list[str]) -> None:
    """ConfigError naming the first upload form that is not one of UPLOADS (sparse with a density in (0, 1], pruned
    with a ratio in [0, 1))."""
    for upload in uploads:
        kind, _, value = upload.partition(":")
        if kind not in UPLOADS or (kind in ("sparse", "pruned", "trained", "secure")) != bool(value):
            raise ConfigError(f"upload {upload!r}: one of {FORMS}")
        if kind == "secure":
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(f"upload {upload!r}: N, the clients in the sum, must be a whole number of 1 or more")
            continue
        if kind == "trained":
            if value not in TRAINED:
                raise ConfigError(f"upload {upload!r}: one of {FORMS}")
            continue
        if value:
            try:
                ok = 0 < float(value) <= 1 if kind == "sparse" else 0 <= float(value) < 1
            except ValueError:
                ok = False
            if not ok:
                what = "the density must be a number in (0, 1]" if kind == "sparse" else "the ratio must be in [0, 1)"
                raise ConfigError(f"upload {upload!r}: {what}")


def audit(
    dataset: str,
    data_dir: str,
    uploads: list[str],
    batches: list[int],
    methods: list[str],
    seeds: list[int],
    clients: int,
    steps: int,
    lr: float,
    iterations: int,
    echo: Callable[[str], None] = print,
    private: Private | None = None,
) -> tuple[list[Row], dict[str, torch.Tensor], tuple[float, float]]:
    """Run every (upload, batch, method) cell on `clients` batches per seed; the rows, the first seed's first batch
    of each cell (true and reconstructed) for the figure, and the pixel bounds. Where the upload leaves the
    classifier out (`body`), iDLG has nothing to read: the attack is given the true labels (an upper bound).
    `private`: every client clips and noises its update as local DP does before the server sees it."""
    check_uploads(uploads)
    raw = {"dataset": dataset, **({"data-dir": data_dir} if data_dir else {})}
    data = dataset_for(parse_run_config(raw).data)
    mean = torch.tensor(data.mean).view(1, -1, 1, 1)
    std = torch.tensor(data.std).view(1, -1, 1, 1)
    bounds = (float(((0 - mean) / std).min()), float(((1 - mean) / std).max()))
    rows, shown, known = [], {}, KnownRound(lr, steps, bounds)
    for upload in uploads:
        for batch in batches:
            for method in methods:
                name = upload + (f"+dp(z={private.noise_multiplier:g},C={private.clip_norm:g})" if private else "")
                row = Row(name, batch, method, [], [], [], [])
                for seed in seeds:
                    model = build_model("auto", dataset, data.input_shape, data.num_classes, seed)
                    params = {name: value.detach() for name, value in model.named_parameters()}
                    trained = upload.startswith("trained:")
                    summed = int(upload.split(":", 1)[1]) if upload.startswith("secure:") else 0
                    if summed:  # the server's view is the sum of dense uploads
                        masks = upload_masks("dense", params, [], model)
                    else:
                        masks = {} if trained else upload_masks(upload, params, prunable_names(model), model)
                    if upload.startswith("pruned:"):  # the client trains the pruned model: removed entries are 0
                        params = {n: v if (m := masks.get(n)) is None else v * m for n, v in params.items()}
                    size = batch * max(summed, 1)  # a sum attacks the union of its clients' batches
                    picks = np.random.default_rng(seed).permutation(len(data.y))[: clients * size]
                    for client in range(clients):
                        index = picks[client * size : (client + 1) * size]
                        x = (torch.tensor(data.x[index].astype(np.float32)) / data.scale - mean) / std
                        y = torch.tensor(data.y[index]).long()
                        attack = Attack(method, iterations, 0.1 if method == "ig" else 1.0)
                        noise = (private, np.random.default_rng([seed, client, 0xA0D1])) if private else None
                        if trained:  # the real client's round on this batch, as its server decodes it
                            real = trained_round(
                                upload.split(":", 1)[1], dataset, data_dir, x, y, known.steps, lr, seed
                            )
                            rebuilt = attack_client(
                                row, real.model, real.start, real.masks, x, y, known, attack, seed, noise, real
                            )
                        else:
                            rebuilt = attack_client(
                                row, model, params, masks, x, y, known, attack, seed, noise, summed=summed
                            )
                        if seed == seeds[0] and client == 0:
                            shown[f"{name}|{batch}|{method}"] = torch.stack([x[:8], rebuilt[:8]])
                rows.append(row)
                psnr = f"PSNR {fmt_ci(*mean_ci(row.psnr)[:2], 1.0, 1)} dB" if row.psnr else "not scored"
                unmoved = f", {row.unmoved} of {len(row.traces)} attacks did not move" if row.unmoved else ""
                echo(f"{name}, batch {batch}, {method}: {psnr}{unmoved}")
    return rows, shown, bounds


def attack_client(
    row: Row,
    model: torch.nn.Module,
    params: dict[str, torch.Tensor],
    masks: Masks,
    x: torch.Tensor,
    y: torch.Tensor,
    known: KnownRound,
    attack: Attack,
    seed: int,
    noise: tuple[Private, np.random.Generator] | None = None,
    real: TrainedRound | None = None,
    summed: int = 0,
) -> torch.Tensor:
    """One client's batch: its update (`real`: the one a real sparse client sent, which trained its mask; else the
    update of plain SGD on the batch; clipped and noised with `noise`), what the server sees of it, iDLG's labels
    (the true ones where the upload leaves the classifier out), the inversion; its scores appended to `row`; the
    reconstruction. `summed` > 0: (x, y) is the union of that many clients' equal batches and the server sees the
    sum of their updates, attacked as their mean with the labels read as counts."""
    if real is not None:
        update = real.update
    elif summed:
        parts = [
            local_update(model, params, xs, ys, known.lr, known.steps)
            for xs, ys in zip(x.chunk(summed), y.chunk(summed), strict=True)
        ]
        update = {k: torch.stack([part[k] for part in parts]).mean(0).detach() for k in parts[0]}
    else:
        update = {k: v.detach() for k, v in local_update(model, params, x, y, known.lr, known.steps).items()}
    if noise is not None:
        update = privatized(update, masks, *noise)
    started = time.perf_counter()
    sees_labels = "head.bias" in masks
    if sees_labels and summed:
        labels = label_counts(update["head.bias"], known.lr, known.steps, len(y))
    else:
        labels = idlg_labels(update["head.bias"], len(y)) if sees_labels else y
    target = observed(update, masks)
    trainable = real.trained if real is not None else None  # a sparse client trained its mask: so does the attack
    rebuilt, trace = invert(model, params, target, masks, labels, tuple(x.shape), known, attack, seed, trainable)
    row.seconds.append(time.perf_counter() - started)
    row.traces.append(trace)
    scores = image_scores(x, rebuilt, known.bounds)
    if trace.moved:  # a reconstruction still at its random start says nothing of what the upload gives away
        row.psnr.extend(scores.psnr)
        row.ssim.extend(scores.ssim)
    row.labels.append(label_accuracy(y, labels) if sees_labels else float("nan"))
    return rebuilt[scores.match]  # in the true images' order


@dataclass(frozen=True)
class Private:
    """Local DP of the attacked clients (docs/privacy.md): the clip bound C and the noise multiplier z."""

    clip_norm: float
    noise_multiplier: float


def privatized(
    update: dict[str, torch.Tensor], masks: Masks, private: Private, rng: np.random.Generator
) -> dict[str, torch.Tensor]:
    """The update as local DP sends it: clipped to C over what it carries and noised with std z * C there
    (common.methods.privacy.local_dp_update); what it does not carry is left as it is (the server never sees it)."""
    names = [name for name in update if name in masks]
    support = [None if masks[n] is None else masks[n].numpy() for n in names]  # type: ignore[union-attr]
    arrays = [update[n].numpy().astype(np.float64) for n in names]
    noised = local_dp_update(arrays, support, private.clip_norm, private.noise_multiplier, rng)
    return {**update, **{n: torch.tensor(a, dtype=update[n].dtype) for n, a in zip(names, noised)}}


def table(rows: list[Row]) -> list[str]:
    """The audit's markdown table: mean +/- 95% interval over every attacked image (PSNR, SSIM) or batch (labels,
    seconds, iterations, matching loss at the start and the end); only batches whose inversion moved from its seeded
    start are scored, and a row where none did says so instead of a score."""
    lines = [
        "| upload | batch | attack | PSNR (dB) | SSIM | labels recovered (%) | attack time (s) | iterations | "
        "matching loss, start -> end | moved |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        labels = [v for v in row.labels if v == v]
        label_cell = fmt_ci(*mean_ci(labels)[:2]) if labels else "not sent (true labels given)"
        if row.psnr:
            psnr, ssim = fmt_ci(*mean_ci(row.psnr)[:2], 1.0, 1), fmt_ci(*mean_ci(row.ssim)[:2], 1.0, 3)
        else:
            psnr = ssim = "not scored: the attack did not move from its start"
        traces = row.traces
        iterations = fmt_ci(*mean_ci([float(t.iterations) for t in traces])[:2], 1.0, 0) if traces else "-"
        start = float(np.median([t.start_loss for t in traces])) if traces else float("nan")
        end = float(np.median([t.final_loss for t in traces])) if traces else float("nan")
        lines.append(
            f"| {row.upload} | {row.batch} | {row.method} | {psnr} | {ssim} | {label_cell} | "
            f"{fmt_ci(*mean_ci(row.seconds)[:2], 1.0, 1)} | {iterations} | {start:.3g} -> {end:.3g} | "
            f"{len(traces) - row.unmoved} of {len(traces)} |"
        )
    rules = sorted({t.rule for row in rows for t in row.traces})
    return lines + ["", "Stopping rules: " + "; ".join(rules) + ". Matching loss: median over the attacked batches."]


def pack_cells(widths: list[int], columns: int) -> list[list[tuple[int, int]]]:
    """Cells of the given widths (images) in lines of `columns` image slots, in order, one empty slot between two
    cells of a line: each line a list of (cell index, first column)."""
    lines: list[list[tuple[int, int]]] = []
    column = columns + 1  # no line open yet
    for index, width in enumerate(widths):
        if column + width > columns:
            lines.append([])
            column = 0
        lines[-1].append((index, column))
        column += width + 1
    return lines


def figure(shown: dict[str, torch.Tensor], bounds: tuple[float, float], path: Path) -> bool:
    """Each cell's true images with its matched reconstructions beneath them, cells packed side by side in lines
    as wide as the largest batch (so a batch-1 cell does not leave a line empty); False without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted(shown.items(), key=lambda cell: cell[1].shape[1])  # the batch-1 cells share lines; stable order
    columns = max(pair.shape[1] for _, pair in cells)
    lines = pack_cells([pair.shape[1] for _, pair in cells], max(columns, 3))
    columns = max(columns, 3)  # room for a batch-1 cell's title
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    fig, axes = plt.subplots(2 * len(lines), columns, figsize=(0.62 * columns + 0.4, 1.3 * len(lines) + 0.4))
    fig.set_layout_engine(ConstrainedLayoutEngine(h_pad=0.01, hspace=0.0))  # a true image sits on its reconstruction
    axes = np.asarray(axes).reshape(2 * len(lines), columns)
    for ax in axes.flat:
        ax.axis("off")
    low, high = bounds
    for row, line in enumerate(lines):
        for index, first in line:
            name, pair = cells[index]
            upload, batch, method = name.split("|")
            for slot in range(pair.shape[1]):
                for kind in (0, 1):
                    ax = axes[2 * row + kind][first + slot]
                    image = ((pair[kind, slot] - low) / (high - low)).clamp(0, 1).permute(1, 2, 0).numpy()
                    ax.imshow(image.squeeze(), cmap="gray" if image.shape[-1] == 1 else None, vmin=0, vmax=1)
            axes[2 * row][first].set_title(f"{upload}\nbatch {batch}, {method}", fontsize=6, loc="left")
    fig.suptitle("true images (upper row of each pair), their matched reconstructions beneath", fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_audit(
    rows: list[Row], shown: dict[str, torch.Tensor], bounds: tuple[float, float], out: Path, command: str
) -> Path:
    """audit.md (the table and the threat model's one-line summary), audit.json (every score) and the figure."""
    out.mkdir(parents=True, exist_ok=True)
    drew = figure(shown, bounds, out / "reconstructions.png")
    lines = [
        "# Leakage audit",
        "",
        f"`{command}`",
        "",
        "An honest-but-curious server attacks one round's upload of each client: it knows the model the round "
        "started from, the learning rate and the local steps, and which coordinates the upload carries; not the "
        "data. Mean +/- 95% interval over the attacked images (PSNR, SSIM) and batches (labels, time).",
        "",
        *table(rows),
        "",
        "![true images and reconstructions](reconstructions.png)" if drew else "(No figure: matplotlib is missing.)",
        "",
    ]
    path = out / "audit.md"
    atomic_write_text(path, "\n".join(lines))
    atomic_write_text(out / "audit.json", json.dumps([asdict(r) for r in rows], indent=1))
    return path
