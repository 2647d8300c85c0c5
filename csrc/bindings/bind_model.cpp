// Bindings for Backend, ModelPlan, Model (its cache stats and prefill layout), GenParams and the
// Generator: type conversion only; checks and arithmetic live in C++ proper or in strata/*.py.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <tuple>

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
  d["hc"] = s.HC;
  d["details"] = s.details;  // architecture-specific (label, value) lines for `strata info`
  return d;
}

py::dict cache_dict(Model& m) {
  ExpertCache& c = m.cache();
  const CacheStats& st = c.stats();
  const ChunkStats& ch = m.chunk_stats();
  py::dict d;
  d["all_resident"] = c.all_resident();
  d["source_kind"] = m.source_describe();
  d["cache_bytes"] = m.config().cache_bytes;
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
  d["prefetch_fills"] = st.prefetch_fills;
  d["prefetch_used"] = st.prefetch_used;
  d["prefetch_wasted"] = st.prefetch_wasted;
  d["prefetch_bytes"] = st.prefetch_bytes;
  d["cpu_experts"] = st.cpu_experts;
  d["cpu_bytes"] = st.cpu_bytes;
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
  d["decode_hits"] = s.decode_hits;
  d["decode_misses"] = s.decode_misses;
  d["decode_bytes"] = s.decode_bytes;
  d["recomputed"] = s.recomputed;
  d["prompt_chunk"] = s.prompt_chunk;
  d["prompt_chunks"] = s.prompt_chunks;
  d["prompt_tps"] = s.prompt_tps();
  d["decode_tps"] = s.decode_tps();
  d["stop_reason"] = s.stop_reason;
  return d;
}

py::dict load_plan_dict(const LoadPlan& lp) {
  py::dict d = chunk_dict(lp.chunk);
  d["kv_type"] = kv_type_name(lp.kv);
  d["kv_bytes"] = lp.kv_bytes;
  d["all_resident"] = lp.all_resident;
  d["cache_bytes"] = lp.cache_bytes;
  d["cache_slots"] = lp.slots;
  d["error"] = lp.error;
  return d;
}

PrefillShape shape_of(const py::dict& shape) {
  PrefillShape s;
  s.D = shape["D"].cast<int64_t>();
  s.HC = shape["HC"].cast<int64_t>();
  s.E = shape["E"].cast<int64_t>();
  s.K = shape["K"].cast<int64_t>();
  s.F = shape["F"].cast<int64_t>();
  s.expert_types = shape["expert_types"].cast<std::vector<uint32_t>>();
  s.gr_unfused = shape["unfused"].cast<bool>();
  // moe_layout "fused": the fused layout where a source streams the experts (else MMQ there too).
  if (shape.contains("streamed_fused")) s.streamed_fused = shape["streamed_fused"].cast<bool>();
  // The architecture's buffers: (name, dtype "f32" or "i32", dims after T) each.
  if (shape.contains("scratch"))
    for (const auto& [name, dtype, row] :
         shape["scratch"].cast<std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>>>()) {
      STRATA_CHECK(dtype == "f32" || dtype == "i32", ConfigError, "prefill scratch '", name,
                   "': dtype must be f32 or i32, got '", dtype, "'");
      s.scratch.push_back(ScratchSpec{name, dtype == "f32" ? ScratchType::F32 : ScratchType::I32, row});
    }
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
      "Prefill::layout(T, src) of a shape dict: D, HC, E, K, F, expert_types, unfused and the "
      "architecture's scratch, a list of (name, dtype, dims after T).");

  py::class_<Backend, std::shared_ptr<Backend>>(m, "Backend", "A compute device and its memory.")
      .def(py::init(&make_backend), py::arg("device") = ModelConfig().device,
           py::arg("threads") = ModelConfig().threads)
      .def_property_readonly("name", &Backend::name)
      .def_property_readonly("threads", &Backend::threads)
      .def("describe", &Backend::describe)
      .def("live_allocations", &Backend::live_allocations);

  py::class_<ModelPlan>(m, "ModelPlan", "What a GGUF header tells: spec, expert slots, prompt-chunk plan.")
      .def(py::init(&ModelPlan::read), py::arg("file"), py::arg("gr_unfused") = false,
           py::arg("streamed_fused") = false)
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
            return chunk_dict(plan_chunk(p.prefill, p.experts.slot_bytes, n_slots, cache_bytes, max_T,
                                         is_auto ? PrefillMode::Auto : PrefillMode::Fixed));
          },
          py::arg("n_slots"), py::arg("cache_bytes"), py::arg("max_tokens"), py::arg("auto") = true)
      .def(
          "plan_load",
          [](const ModelPlan& p, const ModelConfig& cfg, Backend& be) {
            return load_plan_dict(plan_load(p, cfg, be));
          },
          py::arg("config"), py::arg("backend"),
          "What a load with this config on this backend takes (auto resolved), or the error it stops with.");

  // The load options with their one set of defaults; strata.Model fills one and check() refuses a
  // value out of range. expert_cache reads and takes "auto", "all" or a size in bytes; prefill_mode
  // "default", "fixed" or "auto".
  py::class_<ModelConfig>(m, "ModelConfig", "A load's options (model/model.h); the defaults are strata's.")
      .def(py::init<>())
      .def("check", &check_config, "ConfigError naming the first option out of range.")
      .def_readwrite("device", &ModelConfig::device)
      .def_readwrite("threads", &ModelConfig::threads)
      .def_readwrite("ctx", &ModelConfig::ctx)
      .def_readwrite("seqs", &ModelConfig::seqs)
      .def_property(
          "expert_cache",
          [](const ModelConfig& c) -> py::object {
            if (c.cache == CacheKind::Size) return py::int_(c.cache_bytes);
            return py::str(c.cache == CacheKind::All ? "all" : "auto");
          },
          [](ModelConfig& c, const py::object& v) {
            if (py::isinstance<py::str>(v)) {
              const std::string s = v.cast<std::string>();
              STRATA_CHECK(s == "auto" || s == "all", ConfigError,
                           "--expert-cache must be a size, all or auto, got '", s, "'");
              c.cache = s == "all" ? CacheKind::All : CacheKind::Auto;
              c.cache_bytes = 0;
            } else {
              c.cache = CacheKind::Size;
              c.cache_bytes = v.cast<size_t>();
            }
          })
      .def_readwrite("source", &ModelConfig::source)
      .def_property(
          "prefill_mode", [](const ModelConfig& c) { return prefill_mode_name(c.prefill_mode); },
          [](ModelConfig& c, const std::string& v) { c.prefill_mode = parse_prefill_mode(v); })
      .def_readwrite("prefill", &ModelConfig::prefill)
      .def_readwrite("gr_unfused", &ModelConfig::gr_unfused)
      .def_readwrite("kv_type", &ModelConfig::kv_type)
      .def_readwrite("decode_graph", &ModelConfig::decode_graph)
      .def_readwrite("decode_resolve", &ModelConfig::decode_resolve)
      .def_readwrite("moe_layout", &ModelConfig::moe_layout)
      .def_readwrite("cache_policy", &ModelConfig::cache_policy)
      .def_readwrite("prefetch", &ModelConfig::prefetch)
      .def_readwrite("prefetch_max", &ModelConfig::prefetch_max)
      .def_readwrite("prefetch_auto", &ModelConfig::prefetch_auto)
      .def_readwrite("cpu_experts", &ModelConfig::cpu_experts);
  m.attr("PREFILL_AUTO_MAX") = kPrefillAutoMax;
  m.attr("MAX_SEQS") = kMaxSeqs;

  py::class_<Model>(m, "Model")
      .def(py::init([](std::shared_ptr<gguf::File> file, std::shared_ptr<Backend> backend, ModelConfig cfg,
                       py::object progress, bool catch_sigint) {
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
           py::arg("file"), py::arg("backend") = nullptr, py::arg("config") = ModelConfig(),
           py::arg("progress") = py::none(), py::arg("catch_sigint") = false)
      .def_property_readonly(
          "config", [](const Model& mo) { return mo.config(); }, "The options as loaded (auto resolved).")
      .def_property_readonly("decode_graph_active", &Model::decode_graph_active)
      .def_property_readonly(
          "batch_steps",
          [](const Model& mo) {
            return py::dict(py::arg("replayed") = mo.batch_steps_replayed(),
                            py::arg("op_by_op") = mo.batch_steps_op_by_op());
          },
          "Batched decode steps so far: replayed from a recorded graph, and run op by op.")
      .def_property_readonly("decode_resolution", &Model::decode_resolution)
      .def_property_readonly("decode_write_through", &Model::decode_write_through)
      .def_property_readonly("plan", &Model::plan, py::return_value_policy::reference_internal)
      .def("cache_stats", &cache_dict)
      .def("reset_stats", &Model::reset_stats)
      .def("pin", [](Model& mo, int64_t layer, int64_t e) { mo.cache().pin(layer, e); })
      .def_property_readonly("chunk", &Model::chunk)
      .def_property_readonly("seqs", &Model::seqs)
      .def_property_readonly("seq_ctx", &Model::seq_ctx)
      .def_property_readonly("batch_supported", &Model::batch_supported)
      .def("set_trace", [](Model& mo, bool on) { mo.cache().set_trace(on); })
      .def("slot_index", [](Model& mo) { return mo.cache().slot_index(); })
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
             bool catch_sigint, int64_t seq) {
            const int64_t n = ids.size();
            py::array_t<float> out({n, mo.spec().V});
            const int32_t* p = ids.data();
            float* o = out.mutable_data();
            interruptible(catch_sigint, [&](const std::atomic<bool>* stop) {
              RunControl rc;
              rc.interrupt = stop;
              prompt_logits(mo, p, n, o, rc, seq);
            });
            return out;
          },
          py::arg("ids"), py::arg("catch_sigint") = false, py::arg("seq") = 0)
      .def(
          "decode_batch",
          [](Model& mo, const std::vector<int32_t>& ids, const std::vector<int64_t>& pos,
             const std::vector<int32_t>& seqs) {
            STRATA_CHECK(ids.size() == pos.size() && ids.size() == seqs.size(), ConfigError,
                         "decode_batch: ids, positions and seqs must be as long as each other, got ",
                         ids.size(), ", ", pos.size(), " and ", seqs.size());
            const int64_t B = (int64_t)ids.size();
            py::array_t<float> out({B, mo.spec().V});
            float* o = out.mutable_data();
            py::gil_scoped_release nogil;
            step_logits(mo, ids.data(), pos.data(), seqs.data(), B, o);
            return out;
          },
          py::arg("ids"), py::arg("positions"), py::arg("seqs"),
          "One decode step: token ids[i] at positions[i] of KV region seqs[i], every row in one pass; "
          "logits [B, V]. The regions then belong to no generation.")
      .def(
          "prompt_rows",
          [](Model& mo, const std::vector<int32_t>& ids, const std::vector<int64_t>& pos,
             const std::vector<int32_t>& seqs, const std::vector<int32_t>& pick) {
            STRATA_CHECK(ids.size() == pos.size() && ids.size() == seqs.size(), ConfigError,
                         "prompt_rows: ids, positions and seqs must be as long as each other, got ",
                         ids.size(), ", ", pos.size(), " and ", seqs.size());
            py::array_t<float> out({(int64_t)pick.size(), mo.spec().V});
            float* o = out.mutable_data();
            py::gil_scoped_release nogil;
            for (int32_t q : seqs)
              if (q >= 0 && q < mo.seqs()) mo.set_kv_owner(nullptr, q);
            mo.forward_rows(ids.data(), pos.data(), seqs.data(), (int64_t)ids.size(), pick.data(),
                            (int64_t)pick.size(), o);
            return out;
          },
          py::arg("ids"), py::arg("positions"), py::arg("seqs"), py::arg("pick"),
          "Prompts of several KV regions in one pass: row i is token ids[i] at positions[i] of region "
          "seqs[i] (a region's rows contiguous, at consecutive positions); logits [len(pick), V] of the "
          "rows `pick` names (ascending). The regions then belong to no generation.");

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
      .def(py::init<Model&, int64_t>(), py::keep_alive<1, 2>(), py::arg("model"), py::arg("seq") = 0)
      .def_property_readonly("seq", &Generator::seq)
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
      .def("prepare", &Generator::prepare, py::arg("prompt"), py::arg("params"), py::arg("reuse") = nullptr,
           "begin() without its pass: the checks and the reuse of an earlier Generator's KV; run_prompts "
           "then runs this prompt with others in one pass.")
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
  m.def(
      "run_prompts",
      [](Model& mo, const std::vector<Generator*>& gens, bool catch_sigint) {
        interruptible(catch_sigint, [&](const std::atomic<bool>* stop) {
          RunControl rc;
          rc.interrupt = stop;
          run_prompts(mo, gens, rc);
        });
      },
      py::arg("model"), py::arg("generators"), py::arg("catch_sigint") = false,
      "Runs the prompts of prepared generators (distinct KV regions) in one batched pass; each then "
      "samples its first token with next().");
  m.def(
      "next_tokens",
      [](Model& mo, const std::vector<Generator*>& gens, bool catch_sigint) {
        return interruptible(catch_sigint, [&](const std::atomic<bool>* stop) {
          RunControl rc;
          rc.interrupt = stop;
          return next_tokens(mo, gens, rc);
        });
      },
      py::arg("model"), py::arg("generators"), py::arg("catch_sigint") = false,
      "The next token of each generator (-1: ended), those that need a pass decoded together in one "
      "step; the generators are in distinct KV regions.");
}

}  // namespace strata
