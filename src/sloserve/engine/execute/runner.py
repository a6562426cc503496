"""The model runner: one packed forward pass over the paged KV cache, then sampling.

One iteration's tokens are packed into one ``[T, hidden]`` tensor, decodes first then
prefill chunks (the profiler's layout, :mod:`sloserve.costmodel.profiler`), and every
non-attention operator of :class:`~sloserve.costmodel.profiler.llama.LlamaModel` runs once
over them. Per layer, each new token's K and V are written to its slot of
:class:`~sloserve.engine.execute.cache.PagedKVCache`; attention then gathers each
sequence's keys from its slots: all decodes in one padded call (a key-padding mask), each
prefill chunk in its own causal "bottom-right" call (query ``i`` of a chunk after ``ctx``
cached tokens sees keys ``0..ctx+i``). Logits are computed only for sequences that emit a
token this iteration (a prompt's last chunk, a recompute refill's last chunk, a decode).

Sampling: greedy at temperature 0; otherwise Gumbel-max over ``logits / temperature`` with
noise drawn from ``numpy.random.default_rng((seed, req_id, position))``, so a request's
tokens do not depend on which requests shared its batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sloserve.costmodel.profiler.llama import LlamaModel
from sloserve.engine.execute.cache import PagedKVCache


@dataclass(frozen=True)
class SeqWork:
    """One sequence of an iteration: its new tokens and where they sit."""

    req_id: int
    tokens: list[int]
    """Token ids at positions ``start .. start + len(tokens) - 1``."""
    start: int
    emits: bool
    """Whether its last position's logits give the request's next token."""


class ModelRunner:
    """Runs packed iterations of a :class:`LlamaModel` over a :class:`PagedKVCache`."""

    def __init__(
        self, model: LlamaModel, cache: PagedKVCache, *, temperature: float = 0.0, seed: int = 0
    ) -> None:
        self.model = model
        self.cache = cache
        self.temperature = temperature
        self.seed = seed
        self.torch = model.torch

    def forward(self, work: list[SeqWork]) -> dict[int, int]:
        """Run one iteration (the cache already synced); the sampled token per emitting
        request."""
        torch, m, cache = self.torch, self.model, self.cache
        dev = m.device
        decodes = [w for w in work if len(w.tokens) == 1 and w.start > 0]
        prefills = [w for w in work if not (len(w.tokens) == 1 and w.start > 0)]
        order = decodes + prefills
        ids: list[int] = []
        pos: list[int] = []
        write: list[int] = []
        for w in order:
            n = len(w.tokens)
            ids += w.tokens
            pos += range(w.start, w.start + n)
            write += cache.slots_of(w.req_id, w.start + n)[w.start :]
        t_ids = torch.tensor(ids, dtype=torch.long, device=dev)
        t_pos = torch.tensor(pos, dtype=torch.long, device=dev)
        t_write = torch.tensor(write, dtype=torch.long, device=dev)
        dec_idx = dec_mask = None
        if decodes:
            lens = [w.start + 1 for w in decodes]
            width = max(lens)
            pad = np.zeros((len(decodes), width), dtype=np.int64)
            for i, w in enumerate(decodes):
                pad[i, : lens[i]] = cache.slots_of(w.req_id, lens[i])
            dec_idx = torch.from_numpy(pad).to(dev)
            valid = np.arange(width)[None, :] < np.asarray(lens)[:, None]
            dec_mask = torch.from_numpy(valid).to(dev)[:, None, None, :]
        pre: list[tuple[int, int, Any, Any]] = []  # (row, n, key slots, mask)
        row = len(decodes)
        for w in prefills:
            n = len(w.tokens)
            keys = torch.tensor(cache.slots_of(w.req_id, w.start + n), device=dev)
            pre.append((row, n, keys, self._causal(n, w.start + n)))
            row += n
        last: list[int] = []
        emit_ids: list[int] = []
        row = 0
        for w in order:
            row += len(w.tokens)
            if w.emits:
                last.append(row - 1)
                emit_ids.append(w.req_id)
        logits = self._layers(t_ids, t_pos, t_write, dec_idx, dec_mask, len(decodes), pre, last)
        if logits is None:
            return {}
        return self._sample(logits, emit_ids, [pos[i] for i in last])

    def _causal(self, n: int, keys: int) -> Any:
        m = self.model
        if m.lower_right is not None:
            return m.lower_right(n, keys)
        i = self.torch.arange(n).unsqueeze(1)
        j = self.torch.arange(keys).unsqueeze(0)
        return (j <= keys - n + i).to(m.device)

    def _layers(
        self,
        ids: Any,
        pos: Any,
        write: Any,
        dec_idx: Any,
        dec_mask: Any,
        n_dec: int,
        pre: list[tuple[int, int, Any, Any]],
        last: list[int],
    ) -> Any:
        m, F, cache = self.model, self.model.F, self.cache
        spec = m.spec
        nq, nkv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
        x = F.embedding(ids, m.embed)
        t = x.shape[0]
        cos, sin = m.cos[pos], m.sin[pos]
        for li, lay in enumerate(m.layers):
            h = m._rms(x, lay.w_in_norm)
            qkv = F.linear(h, lay.w_qkv)
            q = m._rope(qkv[:, : nq * d].view(t, nq, d), cos, sin)
            k = m._rope(qkv[:, nq * d : (nq + nkv) * d].view(t, nkv, d), cos, sin)
            v = qkv[:, (nq + nkv) * d :].view(t, nkv, d)
            kc, vc = cache.k[li], cache.v[li]
            kc.index_copy_(0, write, k)
            vc.index_copy_(0, write, v)
            out = x.new_empty(t, nq, d)
            if n_dec:
                kk = kc[dec_idx].transpose(1, 2)  # [B, kv heads, keys, d]
                vv = vc[dec_idx].transpose(1, 2)
                o = m._sdpa(q[:n_dec].unsqueeze(2), kk, vv, dec_mask, False)
                out[:n_dec] = o.squeeze(2)
            for row, n, keys, mask in pre:
                kk = kc[keys].transpose(0, 1).unsqueeze(0)
                vv = vc[keys].transpose(0, 1).unsqueeze(0)
                qq = q[row : row + n].transpose(0, 1).unsqueeze(0)
                o = m._sdpa(qq, kk, vv, mask, False)
                out[row : row + n] = o[0].transpose(0, 1)
            x = x + F.linear(out.view(t, nq * d), lay.w_o)
            h = m._rms(x, lay.w_post_norm)
            if m.gated:
                gate, up = F.linear(h, lay.w_gate_up).chunk(2, dim=-1)
                x = x + F.linear(F.silu(gate) * up, lay.w_down)
            else:
                x = x + F.linear(F.silu(F.linear(h, lay.w_gate_up)), lay.w_down)
        if not last:
            return None
        sel = self.torch.tensor(last, dtype=self.torch.long, device=m.device)
        return F.linear(m._rms(x[sel], m.final_norm), m.lm_head)

    def _sample(self, logits: Any, req_ids: list[int], positions: list[int]) -> dict[int, int]:
        lg = logits.float()
        if self.temperature <= 0:
            picks = lg.argmax(dim=-1).tolist()
            return dict(zip(req_ids, (int(p) for p in picks), strict=True))
        scaled = (lg / self.temperature).cpu().numpy()
        out: dict[int, int] = {}
        for i, (rid, p) in enumerate(zip(req_ids, positions, strict=True)):
            g = np.random.default_rng((self.seed, rid, p)).gumbel(size=scaled.shape[1])
            out[rid] = int(np.argmax(scaled[i] + g))
        return out
