"""bench/timeline.py's summary of a Chrome trace: busy times as unions, the copy engine beside the kernels, idle
time, and the two bounds, on a trace whose answers are worked out by hand."""
import importlib.util
import json
import pathlib

import pytest

_PATH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "timeline.py"
_spec = importlib.util.spec_from_file_location("strata_bench_timeline", _PATH)
timeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(timeline)


def _x(cat, name, ts, dur, stream, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"stream": stream, **args}}


def _trace():
    # Stream 7 (compute): kernels at [0, 10), [5, 12) (overlapping: a union of 12), an experts kernel
    # [20, 30), a fill kernel [30, 34). Stream 9 (copies): HtoD [8, 18) of 1000 bytes, [40, 50) of 3000; a
    # DtoH [50, 51) counts as compute. Not GPU work: a CPU op and a flow event.
    ev = [
        _x("kernel", "void k_norm(float*)", 0, 10, 7),
        _x("kernel", "void k_attn<128>(float*)", 5, 7, 7),
        _x("kernel", "void strata::cuda::gemv_row_experts_wt_kernel<(QuantType)12>(ExpertsArgs)", 20, 10, 7),
        _x("kernel", "void strata::cuda::fill_kernel(ExpertResolve, bool)", 30, 4, 7),
        _x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 8, 10, 9, bytes=1000),
        _x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 40, 10, 9, bytes=3000),
        _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 50, 1, 7, bytes=4),
        _x("cpu_op", "aten::empty", 0, 100, 0),
        {"ph": "f", "cat": "ac2g", "name": "flow", "ts": 3},
    ]
    return {"traceEvents": ev}


def test_summary_of_a_worked_trace(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps(_trace()))
    s = timeline.summarize_events(timeline.events(timeline.load_trace(str(p))), units=2)
    # kernels: [0, 12) U [20, 34) U DtoH [50, 51) = 12 + 14 + 1 = 27; copies [8, 18) U [40, 50) = 20
    assert s["kernels_us"] == pytest.approx(27 / 2)
    assert s["copies_us"] == pytest.approx(20 / 2)
    assert s["busy_us"] == pytest.approx({"copy": 10.0, "fill": 2.0, "experts": 5.0, "compute": 13 / 2})
    # at once: [8, 12) only: 4; everything: [0, 18) U [20, 34) U [40, 51) = 18 + 14 + 11 = 43; span 51
    assert s["copy_and_kernels_us"] == pytest.approx(2.0)
    assert s["gpu_busy_us"] == pytest.approx(43 / 2)
    assert s["span_us"] == pytest.approx(51 / 2)
    assert s["idle_us"] == pytest.approx(8 / 2)
    assert s["bound_sum_us"] == pytest.approx(47 / 2)
    assert s["bound_max_us"] == pytest.approx(27 / 2)
    assert s["overlap"] == pytest.approx(4 / 20)
    assert s["copy_bytes"] == 2000
    assert s["copy_gbps_busy"] == pytest.approx(4000 / 20 / 1e3)
    assert s["streams"]["7"]["busy_us"] == pytest.approx(27 / 2)
    assert s["streams"]["9"]["events"] == 1.0
    assert s["top"][0]["name"] == "Memcpy HtoD "  # the name before "(": the largest activity class
    timeline.print_summary(s, "token")


def test_union_and_intersection():
    u = timeline.union([(5, 6), (0, 2), (1, 3), (3, 4), (7, 7)])
    assert u == [(0, 4), (5, 6)]
    assert timeline.intersect(u, [(1, 5.5), (5.8, 9)]) == [(1, 4), (5, 5.5), (5.8, 6)]


def test_a_trace_without_gpu_work_is_refused():
    with pytest.raises(ValueError, match="no GPU activity"):
        timeline.summarize_events(timeline.events({"traceEvents": [_x("cpu_op", "aten::add", 0, 1, 0)]}), 1)


def test_kernels_of_an_anonymous_namespace_keep_their_names():
    # CUPTI names them "ns::(anonymous namespace)::kernel(args)": cut at the first "(", every one of them was
    # "ns::", and an experts kernel among them was not counted as the experts'.
    name = "void strata::cuda::(anonymous namespace)::mmvq_experts_kernel<(strata::QType)12>(strata::cuda::Args)"
    assert timeline.base_name(name) == "void strata::cuda::mmvq_experts_kernel<"
    assert timeline.classify("kernel", name) == "experts"
    assert timeline.classify("kernel", "void strata::cuda::(anonymous namespace)::gather_rows(float*)") == "compute"
    ev = timeline.events({"traceEvents": [
        _x("kernel", "void strata::cuda::(anonymous namespace)::gather_rows(float*)", 0, 4, 7),
        _x("kernel", "void strata::cuda::(anonymous namespace)::scatter_add_kernel(float*)", 4, 2, 7)]})
    s = timeline.summarize_events(ev, 1)
    names = sorted(t["name"] for t in s["top"])
    assert names == ["void strata::cuda::gather_rows", "void strata::cuda::scatter_add_kernel"]


def test_a_kernel_launched_early_counts_from_the_end_of_the_one_before():
    # Programmatic dependent launch: the compute kernel starts at 2 while the experts kernel [0, 10) still runs
    # on its stream and waits inside for it; its own time is [10, 12). A kernel on another stream is not cut.
    ev = timeline.events({"traceEvents": [
        _x("kernel", "void strata::cuda::mmvq_experts_kernel<(QType)12>(Args)", 0, 10, 7),
        _x("kernel", "void strata::cuda::swiglu_q8_0_kernel(float*)", 2, 10, 7),
        _x("kernel", "void strata::cuda::rms_norm(float*)", 3, 2, 8)]})
    s = timeline.summarize_events(ev, 1)
    assert s["busy_us"] == pytest.approx({"copy": 0.0, "fill": 0.0, "experts": 10.0, "compute": 2.0 + 2.0})
    assert s["kernels_us"] == pytest.approx(12.0)
    top = {t["name"]: t for t in s["top"]}
    swiglu = top["void strata::cuda::swiglu_q8_0_kernel"]
    assert swiglu["own_us"] == pytest.approx(2.0) and swiglu["us"] == pytest.approx(10.0)
    assert top["void strata::cuda::rms_norm"]["own_us"] == pytest.approx(2.0)
    assert s["top"][0]["name"] == "void strata::cuda::mmvq_experts_kernel<"
