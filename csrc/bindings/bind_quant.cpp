// Bindings for quant: dequantize, matmul, matmul_q8 and the list of supported types, on numpy arrays.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <tuple>
#include <vector>

#include "bindings/bind.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/quant.h"
#include "quant/quantize.h"

namespace py = pybind11;

namespace strata {
namespace {

using Bytes = py::array_t<uint8_t, py::array::c_style>;
using Floats = py::array_t<float, py::array::c_style | py::array::forcecast>;

// Kernels read 16-bit block fields and F32 rows in place, so the bytes must be 4-byte aligned
// (numpy's own allocations always are; an offset slice may not be).
void check_bytes(const Bytes& a, size_t expected, const char* what) {
  STRATA_CHECK(static_cast<size_t>(a.nbytes()) == expected, ConfigError, what, ": got ", a.nbytes(),
               " bytes, expected ", expected);
  STRATA_CHECK(reinterpret_cast<uintptr_t>(a.data()) % 4 == 0, ConfigError, what,
               ": buffer is not 4-byte aligned; pass a copy (np.ascontiguousarray(...).copy())");
}

}  // namespace

void bind_quant(py::module_& m) {
  m.def(
      "quant_types",
      [] {
        std::vector<std::tuple<uint32_t, std::string, int64_t, size_t>> out;
        for (uint32_t id = 0; id < 64; ++id)
          if (const QuantTraits* q = find_quant(id))
            out.emplace_back(id, q->name, q->block_size, q->type_size);
        return out;
      },
      "(ggml type id, name, block_size, type_size) for every type strata computes with.");

  m.def(
      "dequantize",
      [](uint32_t type, const Bytes& data, int64_t n) {
        const QType t = quant_traits(type, "dequantize").type;
        check_bytes(data, row_bytes(t, n), "dequantize");
        py::array_t<float> out(n);
        {
          py::gil_scoped_release nogil;
          dequantize(t, data.data(), out.mutable_data(), n);
        }
        return out;
      },
      py::arg("type"), py::arg("data"), py::arg("n"),
      "Dequantize n elements of ggml type `type` from raw bytes to float32 (n,).");

  m.def(
      "matmul",
      [](uint32_t type, const Bytes& w, int64_t rows, int64_t cols, const Floats& x, int threads) {
        const QType t = quant_traits(type, "matmul").type;
        STRATA_CHECK(rows >= 0, ConfigError, "matmul: rows=", rows, " is negative");
        check_bytes(w, static_cast<size_t>(rows) * row_bytes(t, cols), "matmul weights");
        STRATA_CHECK(x.ndim() == 2 && x.shape(1) == cols, ConfigError, "matmul: x must be (T, ", cols,
                     "), got ", x.ndim(), " dims with last ", x.ndim() ? x.shape(x.ndim() - 1) : 0);
        STRATA_CHECK(threads >= 1, ConfigError, "matmul: threads=", threads, " must be at least 1");
        const int64_t T = x.shape(0);
        py::array_t<float> y({T, rows});
        {
          py::gil_scoped_release nogil;
          ThreadPool pool(threads);
          matmul(t, w.data(), rows, cols, x.data(), cols, T, y.mutable_data(), rows, pool);
        }
        return y;
      },
      py::arg("type"), py::arg("w"), py::arg("rows"), py::arg("cols"), py::arg("x"), py::arg("threads") = 1,
      "Y (T, rows) = x (T, cols) @ W.T for W of `rows` raw rows of ggml type `type`.");

  m.def(
      "matmul_q8",
      [](uint32_t type, const Bytes& w, int64_t rows, int64_t cols, const Floats& x, int threads) {
        const QType t = quant_traits(type, "matmul_q8").type;
        STRATA_CHECK(rows >= 0, ConfigError, "matmul_q8: rows=", rows, " is negative");
        check_bytes(w, static_cast<size_t>(rows) * row_bytes(t, cols), "matmul_q8 weights");
        STRATA_CHECK(x.ndim() == 2 && x.shape(1) == cols, ConfigError, "matmul_q8: x must be (T, ", cols,
                     "), got ", x.ndim(), " dims with last ", x.ndim() ? x.shape(x.ndim() - 1) : 0);
        STRATA_CHECK(cols % kQK8_0 == 0, ConfigError, "matmul_q8: cols=", cols, " is not a multiple of ",
                     kQK8_0);
        STRATA_CHECK(threads >= 1, ConfigError, "matmul_q8: threads=", threads, " must be at least 1");
        const int64_t T = x.shape(0), xrb = cols / kQK8_0 * kQ8_0Bytes;
        py::array_t<float> y({T, rows});
        {
          py::gil_scoped_release nogil;
          std::vector<uint8_t> xq(static_cast<size_t>(T * xrb));
          for (int64_t i = 0; i < T; ++i) quantize_row_q8_0(x.data() + i * cols, xq.data() + i * xrb, cols);
          ThreadPool pool(threads);
          matmul_q8(t, w.data(), rows, cols, xq.data(), xrb, T, y.mutable_data(), rows, pool);
        }
        return y;
      },
      py::arg("type"), py::arg("w"), py::arg("rows"), py::arg("cols"), py::arg("x"), py::arg("threads") = 1,
      "Y (T, rows) = q8_0(x) (T, cols) @ W.T with integer block dot products (strata::matmul_q8); x is "
      "quantized with quantize_row_q8_0 first.");
  m.def(
      "quantize_q8_0",
      [](const Floats& x) {
        const int64_t n = x.size();
        STRATA_CHECK(n % kQK8_0 == 0, ConfigError, "quantize_q8_0: ", n, " elements is not a multiple of ",
                     kQK8_0);
        py::array_t<uint8_t> out(n / kQK8_0 * kQ8_0Bytes);
        quantize_row_q8_0(x.data(), out.mutable_data(), n);
        return out;
      },
      py::arg("x"), "Raw q8_0 blocks of x (flattened), as quantize_row_q8_0 writes them.");
  m.def(
      "has_matmul_q8", [](uint32_t type) { return has_matmul_q8(quant_traits(type, "has_matmul_q8").type); },
      py::arg("type"), "Whether matmul_q8 has an integer kernel for weights of ggml type `type`.");
}

}  // namespace strata
