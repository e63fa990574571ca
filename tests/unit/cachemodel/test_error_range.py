"""`error_range` and `error_basis`: the stated error, and where it was measured, follow the
method and where the data comes from."""

from __future__ import annotations

import pytest
from kvscope.cachemodel.whatif import ERROR_PP, REAL_ENGINE_ERROR_PP, error_basis, error_range


@pytest.mark.parametrize("method", sorted(ERROR_PP))
@pytest.mark.parametrize("engines", [(), ("simulator",), ("", "simulator")])
def test_simulated_data_takes_the_simulator_sweeps_range(method: str, engines: tuple) -> None:
    assert error_range(method, engines) == ERROR_PP[method]
    assert error_basis(method, engines) == "simulator"


@pytest.mark.parametrize("method", sorted(ERROR_PP))
@pytest.mark.parametrize("engines", [("vllm",), ("simulator", "vllm"), ("sglang",)])
def test_real_engine_data_takes_the_real_measurement(method: str, engines: tuple) -> None:
    stated = error_range(method, engines)
    assert stated == REAL_ENGINE_ERROR_PP.get(
        method, max(ERROR_PP[method], REAL_ENGINE_ERROR_PP["access-replay"])
    )
    assert stated >= ERROR_PP["access-replay"], "never more precise than on the simulator"
    if method == "refault-corrected":
        assert stated == ERROR_PP["refault-corrected"]
    basis = "real-engines" if method in REAL_ENGINE_ERROR_PP else "simulator"
    assert error_basis(method, engines) == basis, "only the replay was measured on real engines"
