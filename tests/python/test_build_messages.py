"""The build says, before it compiles anything, what it compiles and why: pip shows it with -v, and a
new user with nvcc on PATH learns there that the CUDA backend is most of the build and how to skip it."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def configure(tmp_path: pathlib.Path, *defs: str, env: dict[str, str] | None = None) -> str:
    """CMake's configure output (stdout and stderr), for the native library alone (no Python module)."""
    r = subprocess.run(["cmake", "-S", str(REPO), "-B", str(tmp_path / "b"), "-DSTRATA_BUILD_PYTHON=OFF", *defs],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout + r.stderr


@pytest.fixture(autouse=True)
def _needs_cmake():
    if not shutil.which("cmake") or not shutil.which("c++"):
        pytest.skip("needs cmake and a C++ compiler")


def test_a_cpu_only_build_says_so(tmp_path):
    out = configure(tmp_path, "-DSTRATA_CUDA=OFF")
    assert "strata: compiling the CPU backend only (STRATA_CUDA=OFF)" in out, out


@pytest.mark.skipif(not shutil.which("nvcc"), reason="no nvcc on PATH")
def test_auto_with_nvcc_says_what_it_compiles_and_how_to_skip_it(tmp_path):
    out = configure(tmp_path, "-DSTRATA_CUDA=AUTO", "-DSTRATA_CUDA_ARCHS=90;120")
    line = next(ln for ln in out.splitlines() if ln.startswith("strata: compiling the CUDA backend"))
    assert "STRATA_CUDA=AUTO" in line and "nvcc" in line and "2 GPU architecture(s): 90;120" in line, line
    assert "STRATA_CUDA=OFF skips it" in line and "STRATA_CUDA_ARCHS=" in line, line
