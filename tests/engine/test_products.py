"""Weight products prepared once at load (engine.model.products): the packed path agrees with
``F.linear`` on every shape SmolLM2 and the ``small`` preset use, at batch sizes on both sides
of ``min_rows``, with a bias and with a strided input (the MLP's down product reads one half of
the gate/up buffer); and a whole model computes the same logits either way."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bench.linear_products import SHAPES
from engine.config import EngineConfig
from engine.model.products import PLAIN, Product, ProductPlan, plan_products
from engine.sampling_params import SamplingParams
from serving.llm import LLM

ONEDNN = ProductPlan("onednn")
ROWS = (1, 2, 7, 63, 64, 300)


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    scale = want.abs().max().item()
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_packed_float32_agrees_with_linear_on_every_shape(shape: str) -> None:
    n, k = SHAPES[shape]
    gen = torch.Generator().manual_seed(n + k)
    weight = torch.randn(n, k, generator=gen) * k**-0.5
    bias = torch.randn(n, generator=gen)
    packed = Product(weight, bias, ONEDNN)
    assert packed.packed is not None or not torch.backends.mkldnn.is_available()
    for rows in ROWS:
        x = torch.randn(rows, k, generator=gen)
        _close(packed(x), F.linear(x, weight, bias), 1e-5)


def test_a_strided_input_is_multiplied_as_it_reads() -> None:
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(576, 1536, generator=gen)
    buffer = torch.randn(40, 2 * 1536, generator=gen)
    half = buffer.chunk(2, dim=-1)[0]  # strided, as down_proj's input is
    _close(Product(weight, None, ONEDNN)(half), F.linear(half, weight), 1e-5)


def test_bfloat16_is_packed_where_onednn_can_else_plain() -> None:
    gen = torch.Generator().manual_seed(2)
    weight = (torch.randn(960, 576, generator=gen) * 576**-0.5).bfloat16()
    product = Product(weight, None, ONEDNN)
    for rows in ROWS:
        x = torch.randn(rows, 576, generator=gen).bfloat16()
        # within bfloat16's rounding of the output (2 ulps), whichever path ran
        _close(product(x), F.linear(x, weight), 2 * 2**-8)


def test_the_plan_packs_float32_on_cpu_and_leaves_the_rest() -> None:
    cpu = torch.device("cpu")
    want = "onednn" if torch.backends.mkldnn.is_available() else "linear"
    assert plan_products(torch.float32, cpu).kind == want
    assert plan_products(torch.float32, cpu, "off").kind == "linear"
    assert plan_products(torch.bfloat16, cpu).kind == "linear"  # auto: unmeasured
    assert plan_products(torch.bfloat16, cpu, "onednn").kind == want
    assert plan_products(torch.float32, torch.device("cuda")).kind == "linear"
    assert PLAIN.kind == "linear"


def test_a_model_gives_the_same_logits_and_tokens_packed_or_not(tiny_model_dir) -> None:
    assert EngineConfig(model="m").packed_products == "off"  # opt-in (docs/benchmarks.md)
    prompt = [[5, 9, 13, 2, 7, 11] * 5, [3, 4]]
    logits, tokens = [], []
    for mode in ("off", "onednn"):
        llm = LLM(tiny_model_dir, num_threads=1, packed_products=mode)
        try:
            model = llm.engine.runner.model
            assert (model.packed_bytes > 0) == (mode == "onednn")
            hidden = torch.randn(
                5, model.config.hidden_size, generator=torch.Generator().manual_seed(3)
            )
            logits.append(model.compute_logits(hidden))
            outs = llm.generate(prompt, SamplingParams(max_tokens=8, temperature=0))
            tokens.append([o.token_ids for o in outs])
        finally:
            llm.close()
    _close(logits[1], logits[0], 1e-5)
    assert tokens[0] == tokens[1]


def test_the_plain_weight_runs_where_the_plan_leaves_it() -> None:
    """One row, and a product that does not widen from ``narrow_max_rows`` rows on, run
    ``F.linear`` itself (bit-equal); a widening one keeps the packed weight there."""
    gen = torch.Generator().manual_seed(4)
    down = torch.randn(576, 1536, generator=gen)
    product = Product(down, None, ONEDNN)
    for rows in (1, ONEDNN.narrow_max_rows or 64, 300):
        x = torch.randn(rows, 1536, generator=gen)
        assert torch.equal(product(x), F.linear(x, down))
    widening = Product(torch.randn(3072, 576, generator=gen), None, ONEDNN)
    assert widening.max_rows > 1 << 20 and product.max_rows == ONEDNN.narrow_max_rows
