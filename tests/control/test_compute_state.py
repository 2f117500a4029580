"""A real server says which dtype and which decode attention are in force, and why
(``/admin/state``'s ``compute``, and the start-up log): ``--dtype auto``'s choice for this CPU,
and an explicit bfloat16 on a CPU without bfloat16 arithmetic said to be slow at start-up."""

from __future__ import annotations

import pytest

from engine.cpu import cpu_features
from tests.control.support import TOKEN, ServerProcess, state


@pytest.mark.parametrize("asked", ["auto", "bfloat16"])
def test_state_and_log_say_the_dtype_in_force_and_why(tiny_model_dir, tmp_path, asked) -> None:
    server = ServerProcess(tiny_model_dir, tmp_path, ["--admin-token", TOKEN, "--dtype", asked], {})
    server.start()
    try:
        with server.client() as http:
            compute = state(http)["compute"]
    finally:
        server.stop()
    cpu = cpu_features()
    want = "bfloat16" if asked == "bfloat16" or cpu.bf16_arithmetic else "float32"
    assert compute["dtype"] == want
    assert cpu.model in compute["cpu"]
    assert compute["dtype_reason"].startswith("auto" if asked == "auto" else "asked for")
    assert compute["attention"] in ("native", "torch")
    assert compute["attention_reason"]
    log = server.log()
    slow = asked == "bfloat16" and not cpu.bf16_arithmetic
    assert ("several times slower than float32" in log) == slow
