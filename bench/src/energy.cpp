// NVML through dlopen: the driver ships libnvidia-ml.so.1 wherever a GPU is, while nvml.h is an
// optional part of the toolkit, so the few entry points used are declared here by their
// documented C ABI (all return nvmlReturn_t, 0 on success; handles are opaque pointers).
#include <twell/bench/harness.hpp>

#include <dlfcn.h>

#include <cstdint>

#include <cuda_runtime.h>

namespace twell::bench {

struct EnergyMeter::Api {
  using Init = int (*)();
  using Shutdown = int (*)();
  using HandleByPci = int (*)(const char*, void**);
  using Energy = int (*)(void*, unsigned long long*);
  using DriverVersion = int (*)(char*, unsigned);
  using ClockInfo = int (*)(void*, int, unsigned*);
  using ErrorString = const char* (*)(int);

  void* lib = nullptr;
  Init init = nullptr;
  Shutdown shutdown = nullptr;
  HandleByPci handle_by_pci = nullptr;
  Energy energy = nullptr;
  DriverVersion driver_version = nullptr;
  ClockInfo clock_info = nullptr;
  ErrorString error_string = nullptr;
  bool initialised = false;

  ~Api() {
    if (initialised && shutdown != nullptr) shutdown();
    if (lib != nullptr) dlclose(lib);
  }
  std::string describe(int status) const {
    return error_string != nullptr ? std::string(error_string(status)) : "status " + std::to_string(status);
  }
};

namespace {
template <class F>
F symbol(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}
constexpr int kClockSm = 1;   // NVML_CLOCK_SM
constexpr int kClockMem = 2;  // NVML_CLOCK_MEM
}  // namespace

EnergyMeter::EnergyMeter(int device) : api_(std::make_unique<Api>()) {
  api_->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (api_->lib == nullptr) {
    why_ = "libnvidia-ml.so.1 not found";
    return;
  }
  api_->init = symbol<Api::Init>(api_->lib, "nvmlInit_v2");
  api_->shutdown = symbol<Api::Shutdown>(api_->lib, "nvmlShutdown");
  api_->handle_by_pci = symbol<Api::HandleByPci>(api_->lib, "nvmlDeviceGetHandleByPciBusId_v2");
  api_->energy = symbol<Api::Energy>(api_->lib, "nvmlDeviceGetTotalEnergyConsumption");
  api_->driver_version = symbol<Api::DriverVersion>(api_->lib, "nvmlSystemGetDriverVersion");
  api_->clock_info = symbol<Api::ClockInfo>(api_->lib, "nvmlDeviceGetClockInfo");
  api_->error_string = symbol<Api::ErrorString>(api_->lib, "nvmlErrorString");
  if (api_->init == nullptr || api_->handle_by_pci == nullptr || api_->energy == nullptr) {
    why_ = "libnvidia-ml.so.1 lacks the energy entry points";
    return;
  }
  if (const int st = api_->init(); st != 0) {
    why_ = "nvmlInit failed: " + api_->describe(st);
    return;
  }
  api_->initialised = true;
  // CUDA and NVML number devices differently; the PCI bus id names the same one in both.
  char pci[32] = {};
  if (cudaDeviceGetPCIBusId(pci, sizeof pci, device) != cudaSuccess) {
    why_ = "cudaDeviceGetPCIBusId failed";
    return;
  }
  if (const int st = api_->handle_by_pci(pci, &device_); st != 0) {
    why_ = "nvmlDeviceGetHandleByPciBusId failed: " + api_->describe(st);
    return;
  }
  unsigned long long mj = 0;
  if (const int st = api_->energy(device_, &mj); st != 0) {
    why_ = "nvmlDeviceGetTotalEnergyConsumption failed: " + api_->describe(st);
    return;
  }
  available_ = true;
}

EnergyMeter::~EnergyMeter() = default;

std::optional<double> EnergyMeter::joules() const {
  if (!available_) return std::nullopt;
  unsigned long long mj = 0;
  if (api_->energy(device_, &mj) != 0) return std::nullopt;
  return static_cast<double>(mj) * 1e-3;
}

Json EnergyMeter::facts() const {
  Json j = Json::object();
  if (!api_->initialised) return j;
  if (api_->driver_version != nullptr) {
    char version[96] = {};
    if (api_->driver_version(version, sizeof version) == 0) j["driver"] = std::string(version);
  }
  if (api_->clock_info != nullptr && device_ != nullptr) {
    unsigned mhz = 0;
    if (api_->clock_info(device_, kClockSm, &mhz) == 0) j["sm_clock_mhz_now"] = static_cast<int>(mhz);
    if (api_->clock_info(device_, kClockMem, &mhz) == 0) j["memory_clock_mhz_now"] = static_cast<int>(mhz);
  }
  return j;
}

}  // namespace twell::bench
