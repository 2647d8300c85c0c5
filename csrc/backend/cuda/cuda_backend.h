// The CUDA backend: device memory, two streams, events and the ops on one NVIDIA GPU. This header
// includes no CUDA header, so host code and tests use it with any C++ compiler.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace strata {

// The backend on GPU `device`. UnsupportedError "no CUDA device: <reason>" when there is no GPU or
// no driver; ConfigError when `device` is not one of them.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);
// GPUs the driver sees; 0 when there are none or there is no driver. Never throws.
int cuda_device_count();
// "NVIDIA H200, 139.8 GiB free of 139.8 GiB, sm_90". Throws as make_cuda_backend.
std::string cuda_device_describe(int device);

}  // namespace strata
