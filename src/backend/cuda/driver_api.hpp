// The CUDA driver API, loaded at run time.
//
// libreservoir never links libcuda: a machine without a GPU driver must still load
// the library and fall back to the simulated device. The driver is dlopen'ed once per
// process, cuGetProcAddress is found with dlsym, and every other entry point is
// resolved through it at one fixed ABI version (CUDA 12.0, or the driver's own version
// when that is older), so a newer driver never hands back a changed signature.
// <cuda.h> is used for types only.
#pragma once

#include <cuda.h>

#include <string>

namespace reservoir::detail::cuda {

// X(field, versioned symbol): the field of DriverApi, and the symbol whose signature
// the field has. The name passed to cuGetProcAddress is "cu" #field; the versioned
// symbol (cuMemAlloc_v2, ...) is the one cuGetProcAddress returns for CUDA 11.3-12.x
// requests, so the declared type matches what is called.
#define RESERVOIR_CUDA_DRIVER_API(X)                                    \
  X(Init, cuInit)                                                       \
  X(DriverGetVersion, cuDriverGetVersion)                               \
  X(GetErrorName, cuGetErrorName)                                       \
  X(GetErrorString, cuGetErrorString)                                   \
  X(DeviceGetCount, cuDeviceGetCount)                                   \
  X(DeviceGet, cuDeviceGet)                                             \
  X(DeviceGetAttribute, cuDeviceGetAttribute)                           \
  X(DeviceGetName, cuDeviceGetName)                                     \
  X(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain)                   \
  X(DevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2)              \
  X(CtxGetCurrent, cuCtxGetCurrent)                                     \
  X(CtxSetCurrent, cuCtxSetCurrent)                                     \
  X(CtxGetDevice, cuCtxGetDevice)                                       \
  X(CtxSynchronize, cuCtxSynchronize)                                   \
  X(ThreadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode) \
  X(CtxEnablePeerAccess, cuCtxEnablePeerAccess)                         \
  X(DeviceCanAccessPeer, cuDeviceCanAccessPeer)                         \
  X(MemGetInfo, cuMemGetInfo_v2)                                        \
  X(MemAlloc, cuMemAlloc_v2)                                            \
  X(MemFree, cuMemFree_v2)                                              \
  X(EventCreate, cuEventCreate)                                         \
  X(EventDestroy, cuEventDestroy_v2)                                    \
  X(EventRecord, cuEventRecord)                                         \
  X(EventQuery, cuEventQuery)                                           \
  X(EventSynchronize, cuEventSynchronize)                               \
  X(StreamWaitEvent, cuStreamWaitEvent)                                 \
  X(StreamSynchronize, cuStreamSynchronize)                             \
  X(StreamCreate, cuStreamCreate)                                       \
  X(StreamDestroy, cuStreamDestroy_v2)                                  \
  X(MemGetAllocationGranularity, cuMemGetAllocationGranularity)         \
  X(MemAddressReserve, cuMemAddressReserve)                             \
  X(MemAddressFree, cuMemAddressFree)                                   \
  X(MemCreate, cuMemCreate)                                             \
  X(MemRelease, cuMemRelease)                                           \
  X(MemMap, cuMemMap)                                                   \
  X(MemUnmap, cuMemUnmap)                                               \
  X(MemSetAccess, cuMemSetAccess)                                       \
  X(MemHostAlloc, cuMemHostAlloc)                                       \
  X(MemFreeHost, cuMemFreeHost)                                         \
  X(MemcpyDtoH, cuMemcpyDtoH_v2)                                        \
  X(MemcpyHtoD, cuMemcpyHtoD_v2)                                        \
  X(MemcpyDtoHAsync, cuMemcpyDtoHAsync_v2)                              \
  X(MemcpyHtoDAsync, cuMemcpyHtoDAsync_v2)                              \
  X(IpcGetMemHandle, cuIpcGetMemHandle)                                 \
  X(IpcOpenMemHandle, cuIpcOpenMemHandle_v2)                            \
  X(IpcCloseMemHandle, cuIpcCloseMemHandle)                             \
  X(MemExportToShareableHandle, cuMemExportToShareableHandle)           \
  X(MemImportFromShareableHandle, cuMemImportFromShareableHandle)       \
  X(MemPoolCreate, cuMemPoolCreate)                                     \
  X(MemPoolDestroy, cuMemPoolDestroy)                                   \
  X(MemAllocFromPoolAsync, cuMemAllocFromPoolAsync)                     \
  X(MemFreeAsync, cuMemFreeAsync)                                       \
  X(MemPoolSetAttribute, cuMemPoolSetAttribute)                         \
  X(MemPoolGetAttribute, cuMemPoolGetAttribute)                         \
  X(MemPoolTrimTo, cuMemPoolTrimTo)                                     \
  X(MemPoolSetAccess, cuMemPoolSetAccess)                               \
  X(DeviceGetPCIBusId, cuDeviceGetPCIBusId)

struct DriverApi {
// A declarator cannot be parenthesized.
#define RESERVOIR_CUDA_DRIVER_FIELD(field, symbol) \
  decltype(&::symbol) field = nullptr;  // NOLINT(bugprone-macro-parentheses)
  RESERVOIR_CUDA_DRIVER_API(RESERVOIR_CUDA_DRIVER_FIELD)
#undef RESERVOIR_CUDA_DRIVER_FIELD

  // Optional, resolved at the CUDA 12.0 ABI only (null on an older driver): the order
  // of work inside a graph capture. Declared with their 12.0 signatures, which the
  // headers of a newer toolkit no longer name (they declare the 12.3 ones).
  CUresult (*StreamGetCaptureInfo)(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                                   const CUgraphNode**, size_t*) = nullptr;
  CUresult (*GraphNodeGetDependencies)(CUgraphNode, CUgraphNode*, size_t*) = nullptr;

  int driver_version = 0;   // e.g. 13000
  int abi_version = 0;      // the version the entry points were resolved at
  bool has_device = false;  // cuInit succeeded (false: CUDA_ERROR_NO_DEVICE)
  std::string init_error;   // why has_device is false ("" when it is true)
};

// The process-wide driver table, loaded on the first call (thread-safe) and never
// unloaded. nullptr when the driver cannot be used; *why then says why (the same
// answer every time). cuInit(0) has been called when this returns non-null.
const DriverApi* driver(std::string* why);

// "<CUDA_ERROR_NAME>: <description>" for a driver result.
std::string describe(const DriverApi& api, CUresult result);

}  // namespace reservoir::detail::cuda
