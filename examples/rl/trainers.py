"""The two trainers behind one interface, both holding f32 master weights and exporting bf16:

- TorchTrainer: HF transformers' Qwen3ForCausalLM, every parameter trained with AdamW (the real run, GPU).
- NumpyTrainer: qwen3_numpy's forward and hand-derived backward, Adam on the top of the network only (the CPU
  smoke in CI, which has no torch).

Interface: `start(lr)` (a fresh optimizer), `sft_step(pairs) -> loss`, `grpo_step(samples, advantages) ->
trainer logprobs of each sample's completion tokens, computed before the step`, `export()` (the state dict for
mxq_client: bf16), `save(out_dir, src_dir)` (an HF dir mxq serve loads).

The policy-gradient loss is GRPO's, token-level normalised as in DAPO / Dr. GRPO: L = -sum_i A_i sum_t
log pi(y_it) / (total completion tokens), one optimizer step per rollout batch (fully on-policy, so the
importance ratio is 1 and PPO's clipping never engages; the trainer-vs-engine gap is logged instead).
"""

from __future__ import annotations

import importlib.util

import numpy as np

import qwen3_numpy as qn


def _token_coefs(samples, advantages) -> tuple[list[np.ndarray], int]:
    total = max(1, sum(len(c) for _, c in samples))
    return [np.full(len(c), a / total, np.float64) for (_, c), a in zip(samples, advantages)], total


class TorchTrainer:
    name = "torch"

    def __init__(self, model_dir: str, device: str, seed: int, grad_clip: float = 1.0):
        import torch  # noqa: PLC0415  (optional: the numpy trainer runs without it)
        from transformers import Qwen3ForCausalLM  # noqa: PLC0415

        self.torch = torch
        torch.manual_seed(seed)
        self.device = device
        self.model = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
        self.model.train()  # note: Qwen3's attention_dropout is 0, so train() and eval() compute the same
        self.tied = bool(self.model.config.tie_word_embeddings)
        self.grad_clip = grad_clip
        self.opt = None

    def start(self, lr: float) -> None:
        self.opt = self.torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)

    def _logprobs(self, seqs: list[tuple[list[int], list[int]]]):
        """Per sample, log pi of its completion tokens (a graph-connected 1-D tensor). note: right padding
        needs no attention mask: the model is causal, so pads after a sequence never reach its positions."""
        torch = self.torch
        length = max(len(p) + len(c) for p, c in seqs)
        ids = torch.zeros((len(seqs), length), dtype=torch.long)
        for i, (p, c) in enumerate(seqs):
            ids[i, :len(p) + len(c)] = torch.tensor(p + c)
        ids = ids.to(self.device)
        logits = self.model(input_ids=ids).logits.float()
        out = []
        for i, (p, c) in enumerate(seqs):
            lp = torch.log_softmax(logits[i, len(p) - 1:len(p) + len(c) - 1], dim=-1)
            out.append(lp.gather(-1, ids[i, len(p):len(p) + len(c), None])[:, 0])
        return out

    def _step(self, loss) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.opt.step()

    def sft_step(self, pairs) -> float:
        lps = self._logprobs(pairs)
        loss = -self.torch.cat(lps).mean()
        self._step(loss)
        return float(loss.detach())

    def grpo_step(self, samples, advantages) -> list[np.ndarray]:
        lps = self._logprobs(samples)
        total = max(1, sum(len(c) for _, c in samples))
        loss = -sum(a * lp.sum() for a, lp in zip(advantages, lps)) / total
        self._step(loss)
        return [lp.detach().double().cpu().numpy() for lp in lps]

    def export(self) -> dict:
        """bf16 tensors on the trainer's device (mxq_client quantizes torch tensors where they live); a tied
        lm_head.weight is included and ignored by the client, the engine has none."""
        return {k: v.detach().to(self.torch.bfloat16) for k, v in self.model.state_dict().items()}

    def save(self, out_dir: str, src_dir: str) -> None:
        sd = {k: v.float().cpu().numpy() for k, v in self.export().items()
              if not (self.tied and k == "lm_head.weight")}
        qn.write_checkpoint(out_dir, sd, src_dir)


class NumpyTrainer:
    name = "numpy"

    def __init__(self, model_dir: str, seed: int, grad_clip: float = 1.0):
        cfg = qn.Config.load(model_dir)
        self.model = qn.Qwen3(cfg, qn.read_checkpoint(model_dir))
        self.grad_clip = grad_clip
        self.lr, self.t, self.m, self.v = 0.0, 0, {}, {}

    @property
    def trainable(self) -> list[str]:
        return self.model.trainable

    def start(self, lr: float) -> None:
        self.lr, self.t = lr, 0
        self.m = {k: np.zeros_like(self.model.w[k]) for k in self.trainable}
        self.v = {k: np.zeros_like(self.model.w[k]) for k in self.trainable}

    def _adam(self, grads: dict[str, np.ndarray], b1: float = 0.9, b2: float = 0.99, eps: float = 1e-8) -> None:
        norm = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values()))
        scale = min(1.0, self.grad_clip / (norm + 1e-12))  # clip_grad_norm_, as the torch trainer
        self.t += 1
        for k, g in grads.items():
            g = g * scale
            self.m[k] = b1 * self.m[k] + (1 - b1) * g
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g
            mh, vh = self.m[k] / (1 - b1 ** self.t), self.v[k] / (1 - b2 ** self.t)
            self.model.w[k] = (self.model.w[k] - self.lr * mh / (np.sqrt(vh) + eps)).astype(np.float32)

    def _accumulate(self, samples, coefs) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        lps, total = [], {k: np.zeros_like(self.model.w[k]) for k in self.trainable}
        for (p, c), coef in zip(samples, coefs):
            lp, grads = self.model.backward(p + c, len(p), coef)
            lps.append(lp.astype(np.float64))
            for k in total:
                total[k] += grads[k]
        return lps, total

    def sft_step(self, pairs) -> float:
        coefs, _ = _token_coefs(pairs, [1.0] * len(pairs))
        lps, grads = self._accumulate(pairs, coefs)
        self._adam(grads)
        return float(-np.concatenate(lps).mean())

    def grpo_step(self, samples, advantages) -> list[np.ndarray]:
        coefs, _ = _token_coefs(samples, advantages)
        lps, grads = self._accumulate(samples, coefs)
        self._adam(grads)
        return lps

    def export(self) -> dict[str, np.ndarray]:
        """f32 arrays holding bf16 values (bf16 rounding, RNE): quantized by the client exactly as the bf16
        checkpoint the engine loaded, so an unchanged tensor sends unchanged bytes."""
        return {k: qn.bf16_round(v) for k, v in self.model.w.items()}

    def save(self, out_dir: str, src_dir: str) -> None:
        qn.write_checkpoint(out_dir, self.model.w, src_dir)


def make_trainer(kind: str, model_dir: str, device: str, seed: int):
    if kind == "auto":
        kind = "torch" if all(importlib.util.find_spec(m) for m in ("torch", "transformers")) else "numpy"
    if kind == "torch":
        return TorchTrainer(model_dir, device, seed)
    if kind == "numpy":
        return NumpyTrainer(model_dir, seed)  # note: on the CPU, whichever device the engine runs on
    raise SystemExit(f"--trainer {kind!r}: expected auto, torch or numpy")
