"""DM-PFL and DM-PFL+ client half (DM-PFL [KDD 2023] Alg. 1-4): personal mask m_c and weights w_c kept on the device.

Paper: Zhang, Zhou, Wang, Tong, "DM-PFL: Hitchhiking Generic Federated Learning for Efficient Shift-Robust
Personalization", KDD 2023, doi:10.1145/3580305.3599311 (not on arXiv)."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import RecordDict

from common.algorithms import (
    DISAGREE,
    DISAGREE_C_RIGHT,
    DISAGREE_G_RIGHT,
    DISAGREE_TO_C,
    GLOBAL,
    PLUS,
    PLUS_CALIBRATED,
    PLUS_LOGITS,
    DMPFLParams,
)
from common.learning.evaluate import MemoLogits, entropy, predict_logits, shift_key, shifted_share, test_logits
from common.learning.train import TrainStats
from common.methods.dmpfl import (
    PARTIAL,
    AdaptiveModel,
    SelectorStats,
    compose_personal,
    decode_partial_global,
    disagreements,
    encode_partial_global,
    make_selector,
    masks_digest,
    reset_personal_only,
    selector_stats,
)
from common.methods.masks import prune_and_regrow
from common.wire.messages import ARRAYS, GLOBAL_VERSION, PERSONAL_MASK_DIGEST, PHASE, PHASE3_RESET, READJUST_RATIO
from common.wire.validation import PayloadError, read_count, read_fraction, record_to_numpy

from .sparse import GLOBAL as GLOBAL_KEY
from .sparse import GLOBAL_VERSION_KEY, Named, SparseGlobalClient, StaleGlobalModel

PERSONAL = "dmpfl/personal"  # client state: w_c on m_c and m_c, as the codec sends them
BASE_ENTROPY_C, BASE_ENTROPY_G = "dmpfl/base-entropy-c", "dmpfl/base-entropy-g"
PARTIAL_CUT, PARTIAL_ID = "global-partial/cut", "global-partial/id"  # the cut as received, its (version, digest)
Stages = dict[str, torch.nn.Module | None]
# the disagreement rows and the indicator each reads (common/methods/dmpfl.disagreements)
DISAGREEMENT_ROWS = {
    DISAGREE: "disagree",
    DISAGREE_TO_C: "to-c",
    DISAGREE_C_RIGHT: "c-right",
    DISAGREE_G_RIGHT: "g-right",
}


class DMPFLClient(SparseGlobalClient):
    """Phase 1: train theta_c under m_c, readjust m_c, upload w_c*m_c and m_c. Phase 2: train theta_g under m_g,
    upload values on m_g. Phase 3: train only m_c AND NOT m_g (shared weights frozen), upload nothing.

    Phases 1 and 3 may receive only w_g on m_g AND m_c ('global-partial', with the digest of the m_c it was cut
    for): Eq. 4 reads nothing else there. Stages (`stages`): G = theta_g, L1 = theta_c before the round, L2 = the
    model the round trained (theta_c in phases 1 and 3, theta_g in phase 2); L1+ / L2+ under adaptive inference.
    """

    def personal(self, w_g: Named, m_g: Named) -> tuple[Named, Named]:
        """(w_c, m_c) from client state; on first contact w_c = w_g and m_c = m_g."""
        stored = self.load_sparse(PERSONAL)
        if stored is None:
            return {n: a.copy() for n, a in w_g.items()}, {n: m.copy() for n, m in m_g.items()}
        return stored

    def theta_c(self, w_g: Named, m_g: Named, w_c: Named, m_c: Named) -> Named:
        """Eq. 4 on the masked layers; dense layers are shared, so they come from w_g."""
        return {n: compose_personal(w_g[n], m_g[n], w_c[n], m_c[n]) if n in m_c else w_g[n] for n in self.names}

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """One round of the phase the server asks for."""
        phase = read_count(self.instructions(content), PHASE)
        if phase not in (1, 2, 3):
            raise PayloadError(f"phase {phase} is not 1, 2 or 3")
        if PERSONAL_MASK_DIGEST in self.instructions(content):
            if phase == 2:
                raise PayloadError("phase 2 trains the whole theta_g: a partial global model cannot serve it")
            w_g, m_g = self.partial_global(content)
        else:
            w_g, m_g = self.refresh_global(content)
        if phase == 1:
            return self._train_dual_masks(server_round, content, w_g, m_g)
        if phase == 2:
            return self._refine_global(server_round, w_g, m_g)
        reset = self.instructions(content).get(PHASE3_RESET, False)
        if not isinstance(reset, bool):
            raise PayloadError(f"'{PHASE3_RESET}' must be true or false")
        return self._refine_personal(server_round, w_g, m_g, reset)

    def refresh_global(self, content: RecordDict) -> tuple[Named, Named]:
        """As any sparse client; a cut of the version now held whole, or of an older one, is dropped (the whole
        model holds it, and versions only grow; at 10,000 clients the cuts would be a third of the state on disk)."""
        weights, masks = super().refresh_global(content)
        held = self.env.state.load_named(PARTIAL_ID)
        version = read_count(self.instructions(content), GLOBAL_VERSION, allow_zero=True)
        if held is not None and int(held["id"][0]) <= version:
            self.env.state.forget(PARTIAL_CUT)
            self.env.state.forget(PARTIAL_ID)
        return weights, masks

    def partial_global(self, content: RecordDict) -> tuple[Named, Named]:
        """(w_g, m_g) on m_c only: from the message's cut, or the stored cut of this version and m_c; a cut made for
        an m_c this client does not hold is stale (the server then sends the whole model)."""
        config = self.instructions(content)
        expected = config.get(PERSONAL_MASK_DIGEST)
        if not isinstance(expected, int) or isinstance(expected, bool):
            raise PayloadError("a partial global model needs an integer 'personal-mask-digest'")
        version = read_count(config, GLOBAL_VERSION, allow_zero=True)
        state = self.env.state
        personal = self.load_sparse(PERSONAL)
        if personal is None or masks_digest(personal[1]) != expected:
            raise StaleGlobalModel("the server cut the global model for a personal mask this client does not hold")
        m_c = personal[1]
        if PARTIAL in content.array_records:
            cut = record_to_numpy(content.array_records[PARTIAL])
            decoded = decode_partial_global(cut, self.shapes, m_c)
            state.save_named(PARTIAL_CUT, cut)
            state.save_named(PARTIAL_ID, {"id": np.array([version, expected], np.int64)})
            held = state.load_named(GLOBAL_VERSION_KEY)
            if held is not None and int(held["version"][0]) < version:  # the whole model of an older version
                state.forget(GLOBAL_KEY)
                state.forget(GLOBAL_VERSION_KEY)
            return decoded
        held, stored = state.load_named(PARTIAL_ID), state.load_named(PARTIAL_CUT)
        if held is not None and held["id"].tolist() == [version, expected] and stored is not None:
            return decode_partial_global(stored, self.shapes, m_c)
        whole = self.held_global(version)
        if whole is not None:
            return decode_partial_global(encode_partial_global(*whole, m_c), self.shapes, m_c)  # the cut it holds
        raise StaleGlobalModel(f"client holds no cut of global version {version} for its personal mask")

    def _train(
        self, server_round: int, start: Named, masks: Named, **kwargs
    ) -> tuple[torch.nn.Module, TrainStats, torch.nn.Module | None]:
        """(trained model, stats, a copy of the start when `stages` is on)."""
        model = self.to_model(start)
        before = self.snapshot(model)
        stats = self.train_locally(model, server_round, update_masks=self.torch_masks(masks), **kwargs)
        return model, stats, before

    def stages(
        self, w_g: Named, m_g: Named, before_c: torch.nn.Module | None, trained: torch.nn.Module, personal: bool
    ) -> Stages:
        """The stage models when `stages` is on (then the server sends the whole theta_g); L2+ only when `trained`
        is a personal model."""
        if not self.cfg.stages or before_c is None:
            return {}
        model_g = self.to_model(self.theta_g(w_g, m_g))
        stages: Stages = {"G": model_g, "L1": before_c, "L2": trained, "L1+": self.adaptive(before_c, model_g)}
        if personal:
            stages["L2+"] = self.adaptive(trained, model_g)
        return stages

    def adaptive(self, model_c: torch.nn.Module, model_g: torch.nn.Module) -> AdaptiveModel:
        """DM-PFL+ of this pair, its base entropies taken on the pair itself."""
        return AdaptiveModel(model_c, model_g, *self.base_entropies(model_c, model_g))

    def _train_dual_masks(self, server_round: int, content: RecordDict, w_g: Named, m_g: Named) -> RecordDict:
        w_c, m_c = self.personal(w_g, m_g)
        collector = self.gradient_collector()
        model, stats, before = self._train(server_round, self.theta_c(w_g, m_g, w_c, m_c), m_c, on_gradients=collector)
        trained = self.named(model)
        fraction = read_fraction(self.instructions(content), READJUST_RATIO)
        grads = collector.mean()
        if fraction > 0 and set(grads) == set(m_c):
            weights = {n: torch.from_numpy(trained[n]) for n in m_c}
            new_masks, new_weights = prune_and_regrow(weights, grads, self.torch_masks(m_c), fraction)
            m_c = {n: m.numpy() for n, m in new_masks.items()}
            trained.update({n: w.numpy() for n, w in new_weights.items()})
        self.save_sparse(PERSONAL, trained, m_c)
        reply = self.train_reply(stats, None, self.densities(m_c), stages=self.stages(w_g, m_g, before, model, True))
        reply[ARRAYS] = self.upload(trained, m_c, False, (w_g, m_g), server_round)
        return reply

    def _refine_global(self, server_round: int, w_g: Named, m_g: Named) -> RecordDict:
        model, stats, _ = self._train(server_round, self.theta_g(w_g, m_g), m_g)
        stages: Stages = {}
        if self.cfg.stages:
            w_c, m_c = self.personal(w_g, m_g)
            stages = self.stages(w_g, m_g, self.to_model(self.theta_c(w_g, m_g, w_c, m_c)), model, False)
        reply = self.train_reply(stats, None, self.densities(m_g), stages=stages)
        reply[ARRAYS] = self.upload(self.named(model), m_g, True, (w_g, m_g), server_round)
        return reply

    def _refine_personal(self, server_round: int, w_g: Named, m_g: Named, reset: bool) -> RecordDict:
        w_c, m_c = self.personal(w_g, m_g)
        if reset:  # Alg. 3 line 3: w_c <- w_g on (m_g AND m_c), so the personal-only weights restart from 0
            w_c = {n: reset_personal_only(w, m_g[n], m_c[n]) if n in m_c else w for n, w in w_c.items()}
        own = {n: m_c[n] & ~m_g[n] for n in m_c}
        model, stats, before = self._train(
            server_round, self.theta_c(w_g, m_g, w_c, m_c), own, trainable=set(self.prunable)
        )
        w_c = self.named(model)
        self.save_sparse(PERSONAL, w_c, m_c)
        if self.cfg.params_as(DMPFLParams).base_entropy == "train":  # the only reading that stores BE_c
            self.env.state.save_named(BASE_ENTROPY_C, self.selector_stats(model).as_arrays())
        return self.train_reply(
            stats,
            None,
            self.densities(m_c),
            stages=self.stages(w_g, m_g, before, model, True),
            updated=self.densities(own),
            trainable=set(self.prunable),
        )

    def mean_entropy(self, model: torch.nn.Module, inputs: torch.Tensor | None = None) -> float:
        """Mean prediction entropy of a model on `inputs` (default: the client's own training data): a base entropy
        of Alg. 4."""
        x = self.env.data.train_x if inputs is None else inputs
        logits = predict_logits(model, x, device=self.env.device)
        return float(entropy(torch.softmax(logits, 1)).mean())

    def base_entropies(self, model_c: torch.nn.Module, model_g: torch.nn.Module) -> tuple[float, float]:
        """Mean prediction entropy of theta_c and theta_g on the inputs `dmpfl-base-entropy` names (the client's
        training data, or its test inputs without shift)."""
        inputs = self.env.data.test_x if self.cfg.params_as(DMPFLParams).base_entropy == "unshifted-test" else None
        return self.mean_entropy(model_c, inputs), self.mean_entropy(model_g, inputs)

    def selector_stats(self, model: torch.nn.Module) -> SelectorStats:
        """The model's SelectorStats on this client: its temperature fitted on the training data (the data the
        client holds with labels; no slice is held out, so training stays as the paper's), its base entropies on the
        inputs `dmpfl-base-entropy` names."""
        data = self.env.data
        train = predict_logits(model, data.train_x, device=self.env.device)
        unshifted = self.cfg.params_as(DMPFLParams).base_entropy == "unshifted-test"
        inputs = predict_logits(model, data.test_x, device=self.env.device) if unshifted else None
        return selector_stats(train, data.train_y, inputs)

    def stored_selector_stats(
        self, content: RecordDict, model_c: torch.nn.Module, model_g: torch.nn.Module
    ) -> tuple[SelectorStats, SelectorStats]:
        """`dmpfl-base-entropy` train: theta_c's after the client's last phase 3 (else theta_c's now), theta_g's for
        the global version held, computed once per version (phase 3 may have seen only part of theta_g), on the
        training data. unshifted-test: both models' now, their base entropies on the client's own test inputs
        without shift (Sec. 3.4: "the average entropy of models' output logits when inputs are not shifted"; no
        label is read there)."""
        if self.cfg.params_as(DMPFLParams).base_entropy == "unshifted-test":
            return self.selector_stats(model_c), self.selector_stats(model_g)
        stats_c = SelectorStats.from_arrays(self.env.state.load_named(BASE_ENTROPY_C)) or self.selector_stats(model_c)
        version = read_count(self.instructions(content), GLOBAL_VERSION, allow_zero=True)
        stored_g = self.env.state.load_named(BASE_ENTROPY_G)
        stats_g = SelectorStats.from_arrays(stored_g)
        if stats_g is not None and stored_g is not None and int(stored_g["version"][0]) == version:
            return stats_c, stats_g
        stats_g = self.selector_stats(model_g)
        self.env.state.save_named(BASE_ENTROPY_G, {**stats_g.as_arrays(), "version": np.array([version], np.int64)})
        return stats_c, stats_g

    def selector_rows(
        self, model_c: torch.nn.Module, model_g: torch.nn.Module, stats: tuple[SelectorStats, SelectorStats]
    ) -> dict[str, float]:
        """DM-PFL+ as configured (`dmpfl-select-similarity`, `dmpfl-select-calibration`), the two other readings of
        its selector (similarity on logits; calibrated), and where theta_c and theta_g disagree: the shares of
        samples, and of them those the configured selector routes to theta_c and those each model gets right."""
        params = self.cfg.params_as(DMPFLParams)
        plus = make_selector(model_c, model_g, *stats, params.select_similarity, params.select_calibration != "none")
        rows = self.row(PLUS, plus)
        rows.update(self.row(PLUS_LOGITS, make_selector(model_c, model_g, *stats, "logits")))
        rows.update(self.row(PLUS_CALIBRATED, make_selector(model_c, model_g, *stats, "softmax", True)))
        data, degrees, device = self.env.data, self.cfg.shift_degrees, self.env.device
        if len(data.test_y) == 0:
            return rows
        (own_c, draws_c), (own_g, draws_g) = (test_logits(m, data, degrees, device) for m in (model_c, model_g))
        own = disagreements(own_c, own_g, plus.chooses_personal(own_c, own_g), data.test_y)
        drawn = None
        if draws_c is not None and draws_g is not None:
            drawn = disagreements(draws_c, draws_g, plus.chooses_personal(draws_c, draws_g), data.shift_y)
        for row, key in DISAGREEMENT_ROWS.items():
            shares = shifted_share(data, degrees, own[key], drawn[key] if drawn else None)
            rows.update({row.prefix + shift_key(d): v for d, v in shares.items()})
        return rows

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """theta_c (DM-PFL), adaptive inference (DM-PFL+) and theta_g, at every shift degree."""
        w_g, m_g = self.refresh_global(content)
        personal = self.load_sparse(PERSONAL)
        # the three rows run theta_c and theta_g on the same sets: each pays one forward pass per batch; a client
        # that never trained holds w_c = w_g and m_c = m_g, so theta_c is theta_g
        model_g = MemoLogits(self.to_model(self.theta_g(w_g, m_g)))
        if personal is None:  # DM-PFL+ chooses between two identical models: every row is theta_g's, nothing
            # disagrees, and the base entropies (a pass over the training data) would decide nothing
            result = self.evaluate_model(model_g)
            same = {shift_key(d): acc for d, acc in result.shift_accuracy.items()}
            rows = {row.prefix + k: a for row in (PLUS, GLOBAL, PLUS_LOGITS, PLUS_CALIBRATED) for k, a in same.items()}
            rows.update({row.prefix + k: 0.0 for row in DISAGREEMENT_ROWS for k in same})
            return self.eval_reply(result, rows)
        model_c = MemoLogits(self.to_model(self.theta_c(w_g, m_g, *personal)))
        extra = self.selector_rows(model_c, model_g, self.stored_selector_stats(content, model_c, model_g))
        extra.update(self.row(GLOBAL, model_g))
        return self.eval_reply(self.evaluate_model(model_c), extra)
