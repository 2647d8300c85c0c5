"""strata._core exports its module init and nothing else, whatever links it.

Built with a static libstdc++ (as a toolchain whose libstdc++ is static builds it), an extension
that exported libstdc++'s symbols would share them with the process's own libstdc++: two copies,
one locale, a crash the first time an integer is formatted. This builds `_core` once with
-static-libstdc++ (scripts/test points STRATA_STATIC_CORE_BUILD at a build that did; otherwise a
build dir of its own), checks its dynamic symbol table, then loads a model with it in a process
that has loaded the system libstdc++ first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _static_core() -> Path:
    build = os.environ.get("STRATA_STATIC_CORE_BUILD")
    if build:
        found = sorted(Path(build).glob("_core*.so"))
        assert found, f"STRATA_STATIC_CORE_BUILD={build} holds no _core*.so"
        return found[0]
    if not shutil.which("cmake") or not shutil.which("c++"):
        pytest.skip("needs cmake and a C++ compiler")
    static = subprocess.run(["c++", "-print-file-name=libstdc++.a"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(static):
        pytest.skip("the compiler has no static libstdc++ (libstdc++.a)")
    pybind11 = pytest.importorskip("pybind11")
    build = REPO / "build" / "static-core"
    subprocess.run(
        ["cmake", "-S", str(REPO), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DSTRATA_BUILD_TESTS=OFF",
         "-DSTRATA_BUILD_PYTHON=ON", "-DSTRATA_CUDA=OFF", "-DSTRATA_STATIC_LIBSTDCXX=ON",
         f"-Dpybind11_DIR={pybind11.get_cmake_dir()}", f"-DPython_EXECUTABLE={sys.executable}"],
        check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "_core", "-j", str(os.cpu_count() or 2)],
                   check=True, capture_output=True)
    return sorted(build.glob("_core*.so"))[0]


@pytest.fixture(scope="module")
def static_core() -> Path:
    return _static_core()


def test_exports_only_the_module_init(static_core: Path) -> None:
    nm = subprocess.run(["nm", "-D", "--defined-only", str(static_core)], capture_output=True, text=True, check=True)
    names = [line.split()[-1] for line in nm.stdout.splitlines() if line.strip()]
    assert names == ["PyInit__core"], names[:20]
    # libstdc++ is inside, not a dependency: this is the build the test is about.
    needed = subprocess.run(["readelf", "-d", str(static_core)], capture_output=True, text=True, check=True).stdout
    assert "libstdc++" not in needed


RUN = """
import ctypes, sys
ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)  # the process's own libstdc++ comes first
import strata
from strata.testing import make_qwen3moe
assert strata._core.__file__.startswith(sys.argv[1]), strata._core.__file__
path = sys.argv[1] + "/m.gguf"
make_qwen3moe(path, layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, experts=8, top_k=2, expert_ffn=32,
              vocab=300, quant={"experts": "F16"})
m = strata.Model(path, expert_cache="64KiB", prefill=4, ctx=64, progress=False)  # a bounded cache: streams
logits = m.logits([1, 2, 3, 4, 5, 6, 7])
assert logits.shape == (7, 300) and m.cache["misses"] > 0
open(path + ".cut", "wb").write(open(path, "rb").read()[:1000])
try:
    strata.inspect(path + ".cut")  # an error message full of formatted integers
except strata.FormatError as e:
    assert "byte offset 16" in str(e), e
print("ok")
"""


def test_loads_a_model_next_to_the_system_libstdcxx(static_core: Path, tmp_path: Path) -> None:
    pkg = tmp_path / "strata"
    shutil.copytree(REPO / "python" / "strata", pkg, ignore=shutil.ignore_patterns("_core*.so", "__pycache__"))
    shutil.copy(static_core, pkg / static_core.name)
    r = subprocess.run([sys.executable, "-c", RUN, str(tmp_path)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
