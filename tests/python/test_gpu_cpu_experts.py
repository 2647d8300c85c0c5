"""strata.Model(cpu_experts=N) on a GPU (pytest -m gpu; skipped without one): experts computed on the host beside
the GPU's products give the same greedy tokens as the GPU alone (cpu_experts_common)."""

from __future__ import annotations

import pytest

from cpu_experts_common import MIXES, check_same_tokens, make
from gpu_common import has_gpu

pytestmark = pytest.mark.gpu

if not has_gpu():
    pytest.skip("no CUDA backend or no GPU here", allow_module_level=True)


@pytest.mark.parametrize("mix", list(MIXES))
def test_gpu_cpu_share_gives_the_same_tokens(tmp_path, mix):
    check_same_tokens(make(str(tmp_path / f"{mix}.gguf"), mix), "cuda")
