// The one file of lib/metrics that knows whether CUDA was compiled in (no #ifdef elsewhere): it
// asks the CUDA runtime for the GPU's product name, used to pick a default MFU peak. Never
// allocates.
#include "metrics/meters.h"

#ifdef FSDP_HAVE_CUDA_RUNTIME
#include <ATen/cuda/CUDAContextLight.h>
#endif

namespace fsdp::metrics {

std::string device_name(const c10::Device& device) {
  if (device.is_cpu()) return "cpu";
#ifdef FSDP_HAVE_CUDA_RUNTIME
  if (device.is_cuda()) {
    const cudaDeviceProp* prop =
        at::cuda::getDeviceProperties(device.has_index() ? device.index() : 0);
    if (prop != nullptr) return prop->name;
  }
#endif
  return device.str();
}

uint64_t device_total_memory(const c10::Device& device) {
#ifdef FSDP_HAVE_CUDA_RUNTIME
  if (device.is_cuda()) {
    const cudaDeviceProp* prop =
        at::cuda::getDeviceProperties(device.has_index() ? device.index() : 0);
    if (prop != nullptr) return static_cast<uint64_t>(prop->totalGlobalMem);
  }
#endif
  (void)device;
  return 0;
}

}  // namespace fsdp::metrics
