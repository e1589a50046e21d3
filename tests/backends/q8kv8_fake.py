"""A stand-in for the built Q8KV8 module: its three entries, by name, with the kernel's
argument order (entry.cuh), answering with the oracle of what the kernel computes (on CPU)
and recording each call. `noise`: that answer's out times (1 + noise * a seeded normal), a
kernel off its own model by about noise**2 / 2 in cos_diff."""

from __future__ import annotations

import torch

from reference.fp8_attention import sparse_mla_prefill_fp8


class FakeModule(dict):
    def __init__(self, answer: bool = True, noise: float = 0.0):
        super().__init__()
        self.calls: list[tuple[str, tuple]] = []
        self.answer, self.noise = answer, noise
        for name, middle in (("dispatch", 0), ("dispatch_topk_length", 1), ("dispatch_full", 2)):
            self[name] = self._entry(name, middle)

    def _entry(self, name: str, middle: int):
        def call(*args):
            self.calls.append((name, args))
            q8, kv8, idx, q_scale, kv_scale = args[:5]
            sink = length = None
            if middle == 2:
                sink, length = args[5:7]
            elif middle == 1:
                length = args[5]
            out, max_logits, lse = args[5 + middle : 8 + middle]
            s_q, s_kv, h_q, h_kv, d_qk, d_v, topk, sm_scale, _stream = args[8 + middle :]
            assert (s_q, h_q, d_qk) == tuple(q8.shape) and s_kv == kv8.shape[0]
            assert h_q % 64 == 0 and topk % 128 == 0 and h_kv == 1 and d_v == 512
            if not self.answer:
                return
            o, ml, l_ = sparse_mla_prefill_fp8(
                q8, kv8, idx, sm_scale, q_scale=float(q_scale), kv_scale=float(kv_scale),
                d_v=d_v, attn_sink=sink, topk_length=length,
            )  # fmt: skip
            if self.noise:
                g = torch.Generator().manual_seed(1)
                o = o * (1 + self.noise * torch.randn(o.shape, generator=g))
            out.copy_(o)
            max_logits.copy_(ml)
            lse.copy_(l_)

        return call
