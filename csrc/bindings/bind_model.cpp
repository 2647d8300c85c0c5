// Bindings for Model, the expert cache stats, the prefill layout and the Generator.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/bind.h"
#include "core/error.h"
#include "core/log.h"
#include "generate/generator.h"
#include "model/model.h"
#include "prefill/chunk_plan.h"
#include "quant/quant.h"

namespace py = pybind11;

namespace strata {

namespace {

py::dict spec_dict(const Model& m) {
  const ModelSpec& s = m.spec();
  py::dict d;
  d["arch"] = s.arch;
  d["name"] = s.name;
  d["layers"] = s.L;
  d["hidden"] = s.D;
  d["vocab"] = s.V;
  d["heads"] = s.n_head;
  d["kv_heads"] = s.n_kv_head;
  d["head_dim"] = s.head_dim;
  d["experts"] = s.E;
  d["top_k"] = s.K;
  d["expert_ffn"] = s.F;
  d["ctx_train"] = s.ctx_train;
  d["rms_eps"] = s.rms_eps;
  d["rope_base"] = s.rope_base;
  d["dense_bytes"] = s.dense_bytes;
  d["expert_bytes"] = s.expert_bytes;
  d["params_total"] = s.params_total;
  d["params_active"] = s.params_active;
  d["slot_bytes"] = m.expert_layout().slot_bytes;
  return d;
}

py::dict cache_dict(Model& m) {
  ExpertCache& c = m.cache();
  const CacheStats& st = c.stats();
  const ChunkStats& ch = m.chunk_stats();
  py::dict d;
  d["all_resident"] = c.all_resident();
  d["source"] = m.source_kind();
  d["slot_bytes"] = c.slot_bytes();
  d["slots"] = c.n_slots();
  d["hits"] = st.hits;
  d["misses"] = st.misses;
  d["bytes_streamed"] = st.bytes_streamed;
  d["evictions"] = st.evictions;
  d["refills"] = st.refills;
  d["lends"] = st.lends;
  d["slots_lent"] = st.slots_lent;
  d["chunks"] = ch.chunks;
  d["chunk_tokens"] = ch.chunk_tokens;
  d["slots_borrowed"] = ch.slots_borrowed;
  d["region_bytes"] = ch.region_bytes;
  return d;
}

py::dict layout_dict(const Prefill& p, int64_t T, bool src, size_t slot_bytes) {
  const PrefillPlan plan = p.layout(T, src);
  py::dict d;
  d["tokens"] = T;
  d["source"] = src;
  d["kind"] = moe_layout_name(plan.moe);
  d["bytes_needed"] = plan.total;
  d["slot_bytes"] = slot_bytes;
  d["slots"] = slot_bytes ? (plan.total + slot_bytes - 1) / slot_bytes : 0;
  py::list bufs;
  for (const auto& b : plan.buffers) {
    py::dict e;
    e["name"] = b.name;
    e["offset"] = b.offset;
    e["bytes"] = b.bytes;
    e["dtype"] = b.dtype;
    e["shape"] = b.shape;
    bufs.append(e);
  }
  d["buffers"] = bufs;
  return d;
}

}  // namespace

void bind_model(py::module_& m) {
  m.def("set_log_level", [](const std::string& name) { set_log_level(parse_log_level(name)); }, py::arg("level"));
  // The plan for an arbitrary shape, with no model: exactness tests sweep thousands of shapes.
  m.def(
      "prefill_layout",
      [](py::dict shape, int64_t T, bool src) {
        PrefillShape s;
        s.D = shape["D"].cast<int64_t>();
        s.HC = shape.contains("HC") ? shape["HC"].cast<int64_t>() : 1;
        s.E = shape["E"].cast<int64_t>();
        s.K = shape["K"].cast<int64_t>();
        s.F = shape["F"].cast<int64_t>();
        s.n_head = shape["heads"].cast<int64_t>();
        s.n_kv_head = shape["kv_heads"].cast<int64_t>();
        s.head_dim = shape["head_dim"].cast<int64_t>();
        s.expert_types = shape.contains("expert_types") ? shape["expert_types"].cast<std::vector<uint32_t>>()
                                                        : std::vector<uint32_t>(3, (uint32_t)QType::Q4_K);
        s.gr_unfused = shape.contains("unfused") && shape["unfused"].cast<bool>();
        set_expert_kernels(s, uses_matmul_q8);
        return layout_dict(Prefill(s), T, src, 0);
      },
      py::arg("shape"), py::arg("tokens"), py::arg("source") = true);

  py::class_<Model>(m, "Model")
      .def(py::init([](const std::string& path, const std::string& device, int threads, int64_t ctx,
                       int64_t cache_bytes, const std::string& source, int64_t prefill, bool prefill_auto,
                       bool gr_unfused, py::object progress) {
             ModelConfig cfg;
             cfg.device = device;
             cfg.threads = threads;
             cfg.ctx = ctx;
             cfg.all_resident = cache_bytes < 0;
             cfg.cache_bytes = cache_bytes < 0 ? 0 : (size_t)cache_bytes;
             cfg.source = source;
             cfg.prefill = prefill;
             cfg.prefill_auto = prefill_auto;
             cfg.gr_unfused = gr_unfused;
             if (!progress.is_none()) {
               cfg.progress = [progress](uint64_t done, uint64_t total) {
                 py::gil_scoped_acquire g;
                 progress(done, total);
               };
             }
             py::gil_scoped_release nogil;
             return std::make_unique<Model>(path, cfg);
           }),
           py::arg("path"), py::arg("device") = "cpu", py::arg("threads") = 0, py::arg("ctx") = 4096,
           py::arg("cache_bytes") = -1, py::arg("source") = "auto", py::arg("prefill") = 8192,
           py::arg("prefill_auto") = false, py::arg("gr_unfused") = false,
           py::arg("progress") = py::none())
      .def("spec", &spec_dict)
      .def("cache_stats", &cache_dict)
      .def("reset_stats", &Model::reset_stats)
      .def("pin",
           [](Model& mo, int64_t layer, int64_t e) {
             STRATA_CHECK(layer >= 0 && layer < mo.spec().L && e >= 0 && e < mo.spec().E, ConfigError,
                          "pin: layer ", layer, " expert ", e, " out of range (", mo.spec().L, " layers, ",
                          mo.spec().E, " experts)");
             mo.cache().pin(layer, e);
           })
      .def("layout",
           [](const Model& mo, int64_t T, bool src) {
             return layout_dict(mo.prefill(), T, src, mo.expert_layout().slot_bytes);
           })
      .def_property_readonly("chunk", &Model::chunk)
      .def("set_trace", [](Model& mo, bool on) { mo.cache().set_trace(on); })
      .def("trace",
           [](Model& mo) {
             py::list out;
             for (const auto& ev : mo.cache().trace()) out.append(py::make_tuple(ev.lend, ev.layer, ev.expert, ev.refill));
             return out;
           })
      .def("slots_for", &Model::slots_for)
      .def(
          "plan_chunk",
          [](const Model& mo, int64_t cache_bytes, int64_t max_T, bool is_auto) {
            const size_t slot = mo.expert_layout().slot_bytes;
            const ChunkPlan c = plan_chunk(mo.prefill(), slot, cache_bytes / (int64_t)slot, cache_bytes, max_T, is_auto);
            py::dict d;
            d["chunk"] = c.chunk;
            d["slots"] = c.slots;
            d["needs"] = c.needs;
            d["fits"] = c.fits;
            d["error"] = c.error;
            d["cache_slots"] = cache_bytes / (int64_t)slot;
            return d;
          },
          py::arg("cache_bytes"), py::arg("max_tokens"), py::arg("auto") = true)
      .def_property_readonly("threads", [](Model& mo) { return mo.backend().threads(); })
      .def("logits", [](Model& mo, py::array_t<int32_t, py::array::c_style | py::array::forcecast> ids) {
        STRATA_CHECK(ids.ndim() == 1 && ids.size() >= 1, ConfigError, "logits() takes a 1-D list of token ids");
        const int64_t n = ids.size(), V = mo.spec().V;
        py::array_t<float> out({n, V});
        const int32_t* p = ids.data();
        float* o = out.mutable_data();
        {
          py::gil_scoped_release nogil;
          prompt_logits(mo, p, n, o);
        }
        return out;
      });

  py::class_<Generator>(m, "Generator")
      .def(py::init<Model&>(), py::keep_alive<1, 2>())
      .def("begin",
           [](Generator& g, std::vector<int32_t> prompt, int64_t max_tokens, float temperature, int32_t top_k,
              float top_p, float min_p, float repetition_penalty, uint64_t seed, std::vector<int32_t> stop_ids) {
             GenParams p;
             p.max_tokens = max_tokens;
             p.sampler.temperature = temperature;
             p.sampler.top_k = top_k;
             p.sampler.top_p = top_p;
             p.sampler.min_p = min_p;
             p.sampler.repetition_penalty = repetition_penalty;
             p.sampler.seed = seed;
             p.stop_ids = std::move(stop_ids);
             py::gil_scoped_release nogil;
             g.begin(prompt, p);
           })
      .def("next",
           [](Generator& g) {
             py::gil_scoped_release nogil;
             return g.next();
           })
      .def("finish", &Generator::finish, py::arg("reason"))
      .def("stats", [](const Generator& g) {
        const GenStats& s = g.stats();
        py::dict d;
        d["prompt_tokens"] = s.prompt_tokens;
        d["generated"] = s.generated;
        d["prompt_ms"] = s.prompt_ms;
        d["decode_ms"] = s.decode_ms;
        d["decode_passes"] = s.decode_passes;
        d["recomputed"] = s.recomputed;
        d["prompt_tps"] = s.prompt_tps();
        d["decode_tps"] = s.decode_tps();
        d["stop_reason"] = s.stop_reason;
        return d;
      });
}

}  // namespace strata
