// Bindings for Backend, ModelPlan, Model (its cache stats and prefill layout), GenParams and the
// Generator: type conversion only; checks and arithmetic live in C++ proper or in strata/*.py.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/bind.h"
#include "bindings/interrupt.h"
#include "core/log.h"
#include "generate/generator.h"
#include "model/model.h"
#include "prefill/chunk_plan.h"
#include "quant/quant.h"

namespace py = pybind11;

namespace strata {

namespace {

py::dict spec_dict(const ModelPlan& p) {
  const ModelSpec& s = p.spec;
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
  d["slot_bytes"] = p.experts.slot_bytes;
  return d;
}

py::dict cache_dict(Model& m) {
  ExpertCache& c = m.cache();
  const CacheStats& st = c.stats();
  const ChunkStats& ch = m.chunk_stats();
  py::dict d;
  d["all_resident"] = c.all_resident();
  d["source_kind"] = m.source_describe();
  d["cache_bytes"] = m.config().all_resident ? 0 : m.config().cache_bytes;
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

py::dict plan_dict(const PrefillPlan& plan) {
  py::dict d;
  d["tokens"] = plan.T;
  d["source"] = plan.src;
  d["kind"] = moe_layout_name(plan.moe);
  d["bytes_needed"] = plan.total;
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

py::dict chunk_dict(const ChunkPlan& c) {
  py::dict d;
  d["chunk"] = c.chunk;
  d["slots"] = c.slots;
  d["needs"] = c.needs;
  d["fits"] = c.fits;
  d["error"] = c.error;
  return d;
}

py::dict stats_dict(const GenStats& s) {
  py::dict d;
  d["prompt_tokens"] = s.prompt_tokens;
  d["prompt_total"] = s.prompt_total;
  d["prompt_reused"] = s.prompt_reused;
  d["generated"] = s.generated;
  d["prompt_ms"] = s.prompt_ms;
  d["decode_ms"] = s.decode_ms;
  d["decode_passes"] = s.decode_passes;
  d["recomputed"] = s.recomputed;
  d["prompt_chunk"] = s.prompt_chunk;
  d["prompt_chunks"] = s.prompt_chunks;
  d["prompt_tps"] = s.prompt_tps();
  d["decode_tps"] = s.decode_tps();
  d["stop_reason"] = s.stop_reason;
  return d;
}

PrefillShape shape_of(const py::dict& shape) {
  PrefillShape s;
  s.D = shape["D"].cast<int64_t>();
  s.HC = shape["HC"].cast<int64_t>();
  s.E = shape["E"].cast<int64_t>();
  s.K = shape["K"].cast<int64_t>();
  s.F = shape["F"].cast<int64_t>();
  s.n_head = shape["heads"].cast<int64_t>();
  s.n_kv_head = shape["kv_heads"].cast<int64_t>();
  s.head_dim = shape["head_dim"].cast<int64_t>();
  s.expert_types = shape["expert_types"].cast<std::vector<uint32_t>>();
  s.gr_unfused = shape["unfused"].cast<bool>();
  set_expert_kernels(s, uses_matmul_q8);
  return s;
}

}  // namespace

void bind_model(py::module_& m) {
  m.def(
      "set_log_level", [](const std::string& name) { set_log_level(parse_log_level(name)); },
      py::arg("level"));
  // The plan for an arbitrary shape, with no model: exactness tests sweep thousands of shapes.
  m.def(
      "prefill_layout",
      [](const py::dict& shape, int64_t T, bool src) {
        return plan_dict(Prefill(shape_of(shape)).layout(T, src));
      },
      py::arg("shape"), py::arg("tokens"), py::arg("source") = true,
      "Prefill::layout(T, src) of a shape dict: D, HC, E, K, F, heads, kv_heads, head_dim, expert_types, "
      "unfused.");

  py::class_<Backend, std::shared_ptr<Backend>>(m, "Backend", "A compute device and its memory.")
      .def(py::init(&make_backend), py::arg("device") = "cpu", py::arg("threads") = 0)
      .def_property_readonly("name", &Backend::name)
      .def_property_readonly("threads", &Backend::threads)
      .def("describe", &Backend::describe)
      .def("live_allocations", &Backend::live_allocations);

  py::class_<ModelPlan>(m, "ModelPlan", "What a GGUF header tells: spec, expert slots, prompt-chunk plan.")
      .def(py::init(&ModelPlan::read), py::arg("file"), py::arg("gr_unfused") = false)
      .def_readonly("file", &ModelPlan::file)
      .def_property_readonly("spec", &spec_dict)
      .def_property_readonly("slot_bytes", [](const ModelPlan& p) { return p.experts.slot_bytes; })
      .def_property_readonly("gr_unfused", [](const ModelPlan& p) { return p.prefill.shape().gr_unfused; })
      .def(
          "layout",
          [](const ModelPlan& p, int64_t T, bool src) { return plan_dict(p.prefill.layout(T, src)); },
          py::arg("tokens"), py::arg("source") = true)
      .def(
          "region_slots",
          [](const ModelPlan& p, int64_t T) { return region_slots(p.prefill, T, p.experts.slot_bytes); },
          py::arg("tokens"))
      .def(
          "plan_chunk",
          [](const ModelPlan& p, int64_t n_slots, size_t cache_bytes, int64_t max_T, bool is_auto) {
            return chunk_dict(
                plan_chunk(p.prefill, p.experts.slot_bytes, n_slots, cache_bytes, max_T, is_auto));
          },
          py::arg("n_slots"), py::arg("cache_bytes"), py::arg("max_tokens"), py::arg("auto") = true);

  py::class_<Model>(m, "Model")
      .def(py::init([](std::shared_ptr<gguf::File> file, std::shared_ptr<Backend> backend,
                       const std::string& device, int threads, int64_t ctx, bool all_resident,
                       size_t cache_bytes, bool cache_auto, const std::string& source, int64_t prefill,
                       bool prefill_auto, bool gr_unfused, const std::string& kv_type, py::object progress,
                       bool catch_sigint) {
             ModelConfig cfg;
             cfg.device = device;
             cfg.threads = threads;
             cfg.ctx = ctx;
             cfg.all_resident = all_resident;
             cfg.cache_bytes = cache_bytes;
             cfg.cache_auto = cache_auto;
             cfg.kv_type = kv_type;
             cfg.source = source;
             cfg.prefill = prefill;
             cfg.prefill_auto = prefill_auto;
             cfg.gr_unfused = gr_unfused;
             // The expert copy reports after each layer: there Ctrl-C stops the load, which frees
             // what it allocated. (The callback is made here, with the GIL, as it holds `progress`.)
             SigintScope scope(catch_sigint);
             cfg.progress = [progress, stop = scope.flag()](uint64_t done, uint64_t total) {
               if (stop && stop->load()) throw Interrupted();
               if (progress.is_none()) return;
               py::gil_scoped_acquire g;
               progress(done, total);
             };
             try {
               py::gil_scoped_release nogil;
               return std::make_unique<Model>(std::move(file), cfg, std::move(backend));
             } catch (const Interrupted&) {
               scope.delivered();
               throw;
             }
           }),
           py::arg("file"), py::arg("backend") = nullptr, py::arg("device") = "cpu", py::arg("threads") = 0,
           py::arg("ctx") = 4096, py::arg("all_resident") = true, py::arg("cache_bytes") = 0,
           py::arg("cache_auto") = false, py::arg("source") = "auto", py::arg("prefill") = 8192,
           py::arg("prefill_auto") = false, py::arg("gr_unfused") = false, py::arg("kv_type") = "auto",
           py::arg("progress") = py::none(), py::arg("catch_sigint") = false)
      .def_property_readonly("plan", &Model::plan, py::return_value_policy::reference_internal)
      .def("cache_stats", &cache_dict)
      .def("reset_stats", &Model::reset_stats)
      .def("pin", [](Model& mo, int64_t layer, int64_t e) { mo.cache().pin(layer, e); })
      .def_property_readonly("chunk", &Model::chunk)
      .def("set_trace", [](Model& mo, bool on) { mo.cache().set_trace(on); })
      .def("trace",
           [](Model& mo) {
             py::list out;
             for (const auto& ev : mo.cache().trace())
               out.append(py::make_tuple(ev.lend, ev.layer, ev.expert, ev.refill));
             return out;
           })
      .def("slots_for", &Model::slots_for)
      .def(
          "logits",
          [](Model& mo, const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& ids,
             bool catch_sigint) {
            const int64_t n = ids.size();
            py::array_t<float> out({n, mo.spec().V});
            const int32_t* p = ids.data();
            float* o = out.mutable_data();
            interruptible(catch_sigint, [&](const std::atomic<bool>* stop) {
              RunControl rc;
              rc.interrupt = stop;
              prompt_logits(mo, p, n, o, rc);
            });
            return out;
          },
          py::arg("ids"), py::arg("catch_sigint") = false);

  py::class_<SamplerParams>(m, "SamplerParams")
      .def(py::init<>())
      .def("check", &check_sampler_params, "ConfigError naming the first value out of range.")
      .def_readwrite("temperature", &SamplerParams::temperature)
      .def_readwrite("top_k", &SamplerParams::top_k)
      .def_readwrite("top_p", &SamplerParams::top_p)
      .def_readwrite("min_p", &SamplerParams::min_p)
      .def_readwrite("repetition_penalty", &SamplerParams::repetition_penalty)
      .def_readwrite("penalty_last_n", &SamplerParams::penalty_last_n)
      .def_readwrite("seed", &SamplerParams::seed);

  py::class_<GenParams>(m, "GenParams")
      .def(py::init<>())
      .def_readwrite("max_tokens", &GenParams::max_tokens)
      .def_readwrite("sampler", &GenParams::sampler)
      .def_readwrite("stop_ids", &GenParams::stop_ids);

  py::class_<Generator>(m, "Generator")
      .def(py::init<Model&>(), py::keep_alive<1, 2>())
      .def(
          "begin",
          [](Generator& g, const std::vector<int32_t>& prompt, const GenParams& p, bool catch_sigint,
             const py::object& progress, const Generator* reuse) {
            RunControl rc;
            if (!progress.is_none()) {
              rc.progress = [&progress](double done, int64_t total) {
                py::gil_scoped_acquire gil;
                progress(done, total);
              };
            }
            interruptible(catch_sigint, [&](const std::atomic<bool>* stop) {
              rc.interrupt = stop;
              g.begin(prompt, p, rc, reuse);
            });
          },
          py::arg("prompt"), py::arg("params"), py::arg("catch_sigint") = false,
          py::arg("progress") = py::none(), py::arg("reuse") = nullptr,
          "Runs the prompt; progress(done, total) hears its tokens done. With catch_sigint (main thread, "
          "Python's default SIGINT handler), Ctrl-C stops it between layers with KeyboardInterrupt. "
          "reuse: an earlier Generator whose KV cache serves the prompt's common beginning.")
      .def(
          "next",
          [](Generator& g, bool catch_sigint) {
            return interruptible(catch_sigint, [&](const std::atomic<bool>* stop) {
              RunControl rc;
              rc.interrupt = stop;
              return g.next(rc);
            });
          },
          py::arg("catch_sigint") = false)
      .def("finish", &Generator::finish, py::arg("reason"))
      .def("stats", [](const Generator& g) { return stats_dict(g.stats()); });
}

}  // namespace strata
