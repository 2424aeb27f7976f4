"""Adam(W) with its two moments stored in bfloat16: half the optimiser's memory.

AdamW keeps two float32 moments per trained weight: for the embedded model's 135M weights
1.0 GiB, as much as the weights and their gradients together. ``CompactAdam`` stores them
in bfloat16 (8 bits of mantissa) and keeps everything else as torch's AdamW does: float32
master weights, the update computed in float32, bias correction, decoupled weight decay
(AdamW) or L2 (Adam). Each moment is rounded to bfloat16 *stochastically* (up or down with
probabilities that make the rounding unbiased): rounded to nearest, a moment that changes
by less than half a bfloat16 step per update (beta2 = 0.999 moves the second moment by
0.1% a step, under bfloat16's 0.4% resolution) would never change at all.

Parameters are updated in slices of ``CHUNK`` elements through three float32 buffers of
that size, allocated once per step and reused by every slice (``Workspace``): no
temporary per operation, so a step neither asks the allocator for gigabytes of fresh pages
(each first touched, and zeroed, by the kernel: more than the arithmetic on a CPU) nor
leaves the cache. The rounding noise is drawn once per step and device (``CHUNK`` 32-bit
values: 16 bits for each moment) and reused by every slice: drawing it per element took
several times the update's own time on a CPU. Each moment's rounding stays unbiased at every step;
elements at the same offset of different slices round together within a step, never
across steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

# Elements per slice: 1 MiB per float32 buffer, small enough that a slice's three buffers
# stay in the CPU's cache while the update runs over them.
CHUNK = 1 << 18


def stochastic_round_bf16(x: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
    """float32 -> bfloat16, rounding up or down with probability proportional to the
    distance (the expectation is ``x``). Adds uniform noise below bfloat16's last mantissa
    bit to the float32 bit pattern and truncates: a carry rounds the magnitude up.

    ``noise``: int32 values in [0, 2^16), at least as many as ``x`` has (fresh if None).
    """
    bits = x.contiguous().view(torch.int32)
    if noise is None:
        noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=x.device)
    else:
        noise = noise.view(-1)[: bits.numel()].view(bits.shape)
    return (bits + noise).bitwise_and_(-65536).view(torch.float32).to(torch.bfloat16)


class Workspace:
    """One step's float32 buffers (``CHUNK`` elements each) and rounding noise on one
    device: ``noise`` holds the two moments' (int32 values in [0, 2^16))."""

    def __init__(self, device: torch.device) -> None:
        self.m, self.v, self.d = (
            torch.empty(CHUNK, dtype=torch.float32, device=device) for _ in range(3)
        )
        bits = torch.randint(-(1 << 31), 1 << 31, (CHUNK,), dtype=torch.int32, device=device)
        self.noise = (bits & 0xFFFF, (bits >> 16) & 0xFFFF)


def _round_into_(out: torch.Tensor, x: torch.Tensor, noise: torch.Tensor) -> None:
    """``out`` (bfloat16) = ``x`` stochastically rounded (``stochastic_round_bf16``);
    ``x``, a float32 buffer, is overwritten. The low 16 bits end zero, so the final
    conversion is exact."""
    x.view(torch.int32).add_(noise[: x.numel()]).bitwise_and_(-65536)
    out.copy_(x)


def adam_update_(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    *,
    step: int,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    decoupled: bool,
    work: Workspace,
) -> None:
    """One Adam(W) update of ``param`` in place; ``exp_avg``/``exp_avg_sq`` (bfloat16,
    same shape) are read and written back. The arithmetic is torch's AdamW's, a slice of
    ``CHUNK`` elements at a time in ``work``'s buffers."""
    beta1, beta2 = betas
    bias1 = 1 - beta1**step
    bias2_sqrt = math.sqrt(1 - beta2**step)
    noise_m, noise_v = work.noise
    flat = [t.view(-1) for t in (param, grad, exp_avg, exp_avg_sq)]
    for p, g, m16, v16 in zip(*(t.split(CHUNK) for t in flat), strict=True):
        n = p.numel()
        m, v, d = work.m[:n], work.v[:n], work.d[:n]
        if weight_decay and not decoupled:
            g = torch.add(g, p, alpha=weight_decay, out=d)
        m.copy_(m16).lerp_(g, 1 - beta1)
        v.copy_(v16).mul_(beta2).addcmul_(g, g, value=1 - beta2)
        if weight_decay and decoupled:
            p.mul_(1 - lr * weight_decay)
        torch.sqrt(v, out=d).div_(bias2_sqrt).add_(eps)
        p.addcdiv_(m, d, value=-lr / bias1)
        _round_into_(m16, m, noise_m)
        _round_into_(v16, v, noise_v)


class CompactAdam(torch.optim.Optimizer):
    """Adam(W) with bfloat16 moments (module docstring); float32 parameters only."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        decoupled: bool = True,
    ) -> None:
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "decoupled": decoupled,
        }
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype != torch.float32:
                    raise ValueError(f"CompactAdam updates float32 parameters, got {p.dtype}")

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 (torch's signature)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work: dict[torch.device, Workspace] = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.device not in work:
                    work[p.device] = Workspace(p.device)
                if p.grad.is_sparse:
                    raise RuntimeError("CompactAdam does not take sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.bfloat16)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.bfloat16)
                state["step"] += 1
                adam_update_(
                    p,
                    p.grad,
                    state["exp_avg"],
                    state["exp_avg_sq"],
                    step=int(state["step"]),
                    lr=group["lr"],
                    betas=group["betas"],
                    eps=group["eps"],
                    weight_decay=group["weight_decay"],
                    decoupled=group["decoupled"],
                    work=work[p.device],
                )
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        """Also takes a float32-moment state (torch's AdamW, an earlier checkpoint): its
        moments are rounded to bfloat16 (to nearest: once, not every step)."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:  # torch's groups lack ``decoupled``
            for key, value in self.defaults.items():
                group.setdefault(key, value)
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state and state[key].dtype != torch.bfloat16:
                    state[key] = state[key].to(torch.bfloat16)
            if "step" in state and not isinstance(state["step"], torch.Tensor):
                state["step"] = torch.tensor(float(state["step"]))
