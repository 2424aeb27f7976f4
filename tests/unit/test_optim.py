"""CompactAdam: torch's Adam(W) arithmetic with bfloat16 moments, rounded without bias."""

from __future__ import annotations

import pytest
import torch

from sapo_node.train import optim
from sapo_node.train.optim import CompactAdam, stochastic_round_bf16


def test_stochastic_rounding_is_unbiased_and_lands_on_a_neighbour() -> None:
    g = torch.Generator().manual_seed(0)
    # Values between two bfloat16 neighbours, both signs, several binades.
    x = torch.tensor([1.0 + 2**-9, -3.0 - 3 * 2**-8, 1e-6 * (1 + 2**-10), 7.0e3 + 1.0])
    noise = torch.randint(0, 1 << 16, (20000, len(x)), dtype=torch.int32, generator=g)
    draws = torch.stack([stochastic_round_bf16(x, n).float() for n in noise])
    down = x.to(torch.bfloat16).float()  # nearest; the other neighbour is one step away
    for i in range(len(x)):
        values = set(draws[:, i].tolist())
        assert len(values) == 2, values  # exactly the two neighbours
        assert float(draws[:, i].mean()) == pytest.approx(float(x[i]), rel=2e-4)
        assert float(down[i]) in values
    exact = torch.tensor([0.0, 1.0, -2.5, 2.0**-66])  # representable: never moved
    assert torch.equal(stochastic_round_bf16(exact).float(), exact)


def test_rounding_to_nearest_would_freeze_a_slow_moment() -> None:
    """Why stochastic: beta2 = 0.999 moves v by 0.1% a step, under half a bfloat16 step."""
    v = torch.full((4096,), 1.0)
    g2 = torch.full((4096,), 2.0)  # v should climb towards 2
    nearest, stochastic = v.to(torch.bfloat16), v.to(torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        nearest = (nearest.float() * 0.999 + 0.001 * g2).to(torch.bfloat16)
        noise = torch.randint(0, 1 << 16, (4096,), dtype=torch.int32, generator=gen)
        stochastic = stochastic_round_bf16(stochastic.float() * 0.999 + 0.001 * g2, noise)
    expected = 2 - 0.999**200  # 1.181
    assert float(nearest.float().mean()) == 1.0
    assert float(stochastic.float().mean()) == pytest.approx(expected, rel=5e-3)


@pytest.mark.parametrize(
    ("decoupled", "weight_decay", "reference"),
    [
        (True, 0.0, torch.optim.AdamW),
        (True, 0.1, torch.optim.AdamW),
        (False, 0.1, torch.optim.Adam),
    ],
)
def test_it_follows_torch_adam_within_bfloat16_moment_rounding(
    monkeypatch, decoupled: bool, weight_decay: float, reference
) -> None:
    monkeypatch.setattr(optim, "CHUNK", 1000)  # slices that do not divide the parameters
    torch.manual_seed(0)
    shapes = [(37, 29), (2500,), (3,)]
    ours = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    kw = {"lr": 1e-2, "betas": (0.9, 0.999), "weight_decay": weight_decay}
    opt = CompactAdam(ours, decoupled=decoupled, **kw)
    ref = reference(theirs, **kw)
    start = [p.detach().clone() for p in ours]
    for _ in range(30):
        for a, b in zip(ours, theirs, strict=True):
            grad = torch.randn_like(a)
            a.grad, b.grad = grad.clone(), grad.clone()
        opt.step()
        ref.step()
    for a, b, s in zip(ours, theirs, start, strict=True):
        moved = (b.detach() - s).norm()
        assert float(moved) > 0.05
        # The moments differ by ~0.4% (bfloat16): the updates follow torch's to ~1%.
        assert float((a - b).detach().norm() / moved) < 0.02
        state = opt.state[a]
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
        assert int(state["step"]) == 30


def test_it_resumes_from_its_own_state_and_from_a_float32_adamw_state() -> None:
    torch.manual_seed(1)
    p = torch.nn.Parameter(torch.randn(50))
    torch_adamw = torch.optim.AdamW([p], lr=1e-2)
    p.grad = torch.randn(50)
    torch_adamw.step()
    ours = CompactAdam([p], lr=1e-2)
    ours.load_state_dict(torch_adamw.state_dict())
    state = ours.state[p]
    assert state["exp_avg"].dtype == torch.bfloat16 and int(state["step"]) == 1
    assert torch.allclose(state["exp_avg"].float(), torch_adamw.state[p]["exp_avg"], rtol=1e-2)
    ours.step()
    again = CompactAdam([p], lr=1e-2)
    again.load_state_dict(ours.state_dict())
    assert torch.equal(again.state[p]["exp_avg_sq"], ours.state[p]["exp_avg_sq"])
    assert int(again.state[p]["step"]) == 2


def test_it_refuses_half_precision_parameters() -> None:
    with pytest.raises(ValueError, match="float32"):
        CompactAdam([torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))], lr=1e-3)


def test_the_in_place_rounding_of_a_step_is_stochastic_round_bf16() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5000, generator=g) * torch.logspace(-30, 30, 5000)
    noise = torch.randint(0, 1 << 16, (5000,), dtype=torch.int32, generator=g)
    out = torch.empty(5000, dtype=torch.bfloat16)
    optim._round_into_(out, x.clone(), noise)
    assert torch.equal(out, stochastic_round_bf16(x, noise))
