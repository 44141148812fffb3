"""DM-PFL and DM-PFL+ client half (papers/001 Alg. 1-4): personal mask m_c and weights w_c kept on the device."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import RecordDict

from common.algorithms import GLOBAL, PLUS
from common.dmpfl import adaptive_predict, compose_personal
from common.evaluate import entropy, predict_logits, shift_accuracy, shift_key
from common.masks import prune_and_regrow
from common.train import train
from common.validation import PayloadError, read_count, read_fraction

from .sparse import Named, SparseGlobalClient

PERSONAL_W, PERSONAL_M, BASE_ENTROPY = "dmpfl/w_c", "dmpfl/m_c", "dmpfl/base-entropy"


class DMPFLClient(SparseGlobalClient):
    """Phase 1: train theta_c under m_c, readjust m_c, upload w_c*m_c and m_c. Phase 2: train theta_g under m_g,
    upload values on m_g. Phase 3: train only m_c AND NOT m_g (shared weights frozen), upload nothing."""


    def personal(self, w_g: Named, m_g: Named) -> tuple[Named, Named]:
        """(w_c, m_c) from client state; on first contact w_c = w_g and m_c = m_g."""
        w_c, m_c = self.env.state.load_named(PERSONAL_W), self.env.state.load_named(PERSONAL_M)
        if w_c is None or m_c is None:
            return {n: a.copy() for n, a in w_g.items()}, {n: m.copy() for n, m in m_g.items()}
        return w_c, m_c

    def theta_c(self, w_g: Named, m_g: Named, w_c: Named, m_c: Named) -> Named:
        """Eq. 4 on the masked layers; dense layers are shared, so they come from w_g."""
        return {n: compose_personal(w_g[n], m_g[n], w_c[n], m_c[n]) if n in m_c else w_g[n] for n in self.names}

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """One round of the phase the server asks for."""
        phase = read_count(self.instructions(content), "phase")
        if phase not in (1, 2, 3):
            raise PayloadError(f"phase {phase} is not 1, 2 or 3")
        w_g, m_g = self.refresh_global(content)
        if phase == 1:
            return self._train_dual_masks(server_round, content, w_g, m_g)
        if phase == 2:
            return self._refine_global(server_round, w_g, m_g)
        return self._refine_personal(server_round, w_g, m_g)

    def _train(self, server_round: int, start: Named, masks: Named, **kwargs):
        model = self.to_model(start)
        stats = train(model, self.env.data.train_x, self.env.data.train_y, self.settings(server_round),
                      self.generator(server_round), update_masks=self.torch_masks(masks), device=self.env.device,
                      **kwargs)
        return model, stats

    def _train_dual_masks(self, server_round: int, content: RecordDict, w_g: Named, m_g: Named) -> RecordDict:
        w_c, m_c = self.personal(w_g, m_g)
        collector = self.gradient_collector()
        model, stats = self._train(server_round, self.theta_c(w_g, m_g, w_c, m_c), m_c, on_gradients=collector)
        trained = self.named(model)
        fraction = read_fraction(self.instructions(content), "readjust-ratio")
        grads = collector.mean()
        if fraction > 0 and set(grads) == set(m_c):
            weights = {n: torch.from_numpy(trained[n]) for n in m_c}
            new_masks, new_weights = prune_and_regrow(weights, grads, self.torch_masks(m_c), fraction)
            m_c = {n: m.numpy() for n, m in new_masks.items()}
            trained.update({n: w.numpy() for n, w in new_weights.items()})
        self.env.state.save_named(PERSONAL_W, trained)
        self.env.state.save_named(PERSONAL_M, m_c)
        reply = self.train_reply(stats, None, self.densities(m_c))
        reply["arrays"] = self.upload(trained, m_c, values_only=False)
        return reply

    def _refine_global(self, server_round: int, w_g: Named, m_g: Named) -> RecordDict:
        model, stats = self._train(server_round, self.theta_g(w_g, m_g), m_g)
        reply = self.train_reply(stats, None, self.densities(m_g))
        reply["arrays"] = self.upload(self.named(model), m_g, values_only=True)
        return reply

    def _refine_personal(self, server_round: int, w_g: Named, m_g: Named) -> RecordDict:
        w_c, m_c = self.personal(w_g, m_g)
        own = {n: m_c[n] & ~m_g[n] for n in m_c}
        model, stats = self._train(server_round, self.theta_c(w_g, m_g, w_c, m_c), own, trainable=set(self.prunable))
        w_c = self.named(model)
        self.env.state.save_named(PERSONAL_W, w_c)
        self.env.state.save_named(PERSONAL_M, m_c)
        base_c, base_g = self.base_entropies(model, self.to_model(self.theta_g(w_g, m_g)))
        self.env.state.save_named(BASE_ENTROPY, {"be": np.array([base_c, base_g], np.float64)})
        return self.train_reply(stats, None, self.densities(own))

    def base_entropies(self, model_c: torch.nn.Module, model_g: torch.nn.Module) -> tuple[float, float]:
        """Mean prediction entropy of theta_c and theta_g on the client's own training data."""
        x = self.env.data.train_x

        def mean_entropy(model: torch.nn.Module) -> float:
            return float(entropy(torch.softmax(predict_logits(model, x, device=self.env.device), 1)).mean())

        return mean_entropy(model_c), mean_entropy(model_g)

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """theta_c (DM-PFL), adaptive inference (DM-PFL+) and theta_g, at every shift degree."""
        w_g, m_g = self.refresh_global(content)
        w_c, m_c = self.personal(w_g, m_g)
        model_c = self.to_model(self.theta_c(w_g, m_g, w_c, m_c))
        model_g = self.to_model(self.theta_g(w_g, m_g))
        stored = self.env.state.load_named(BASE_ENTROPY)
        base_c, base_g = stored["be"].tolist() if stored else self.base_entropies(model_c, model_g)
        device = self.env.device

        def adaptive(x: torch.Tensor) -> torch.Tensor:
            return adaptive_predict(predict_logits(model_c, x, device=device),
                                    predict_logits(model_g, x, device=device), base_c, base_g)[0]

        degrees = self.cfg.shift_degrees
        plus = shift_accuracy(adaptive, self.env.data, degrees)
        extra = {PLUS.prefix + shift_key(d): plus[d] for d in degrees}
        extra.update(self.row(GLOBAL, model_g))
        return self.eval_reply(self.evaluate_model(model_c), extra)
