/* A pluggable allocator over cuMem calls with sleep and wake, the shape of vLLM's
 * CuMemAllocator: my_malloc / my_free are torch.cuda.memory.CUDAPluggableAllocator's
 * functions; sleep_all releases every allocation's physical memory and keeps its
 * virtual range, wake_all maps fresh memory at the same addresses (contents are the
 * caller's to restore). Built by mempool_allocator_worker.py with the system's C
 * compiler, against the CUDA driver API. */
#include <cuda.h>
#include <stddef.h>
#include <stdio.h>

#define MAX_ALLOCATIONS 4096

struct allocation {
  CUdeviceptr va;
  size_t size;
  int device;
  CUmemGenericAllocationHandle handle;
  int mapped;
};
static struct allocation table[MAX_ALLOCATIONS];
static int allocs, frees, failures;

static int ok(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return 1;
  const char* name = NULL;
  cuGetErrorName(r, &name);
  fprintf(stderr, "cumem_pluggable: %s failed: %s\n", what, name ? name : "?");
  ++failures;
  return 0;
}

static int map_at(struct allocation* a) {
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = a->device;
  if (!ok(cuMemCreate(&a->handle, a->size, &prop, 0), "cuMemCreate")) return 0;
  if (!ok(cuMemMap(a->va, a->size, 0, a->handle, 0), "cuMemMap")) {
    cuMemRelease(a->handle);
    return 0;
  }
  CUmemAccessDesc access = {0};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = a->device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (!ok(cuMemSetAccess(a->va, a->size, &access, 1), "cuMemSetAccess")) return 0;
  a->mapped = 1;
  return 1;
}

static void unmap(struct allocation* a) {
  ok(cuMemUnmap(a->va, a->size), "cuMemUnmap");
  ok(cuMemRelease(a->handle), "cuMemRelease");
  a->mapped = 0;
}

void* my_malloc(size_t size, int device, void* stream) {
  (void)stream;
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  size_t granularity = 0;
  if (!ok(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity"))
    return NULL;
  for (int i = 0; i < MAX_ALLOCATIONS; ++i) {
    struct allocation* a = &table[i];
    if (a->va) continue;
    a->size = (size + granularity - 1) / granularity * granularity;
    a->device = device;
    if (!ok(cuMemAddressReserve(&a->va, a->size, 0, 0, 0), "cuMemAddressReserve")) {
      a->va = 0;
      return NULL;
    }
    if (!map_at(a)) {
      cuMemAddressFree(a->va, a->size);
      a->va = 0;
      return NULL;
    }
    ++allocs;
    return (void*)a->va;
  }
  return NULL;
}

void my_free(void* ptr, size_t size, int device, void* stream) {
  (void)size; (void)device; (void)stream;
  for (int i = 0; i < MAX_ALLOCATIONS; ++i) {
    struct allocation* a = &table[i];
    if (a->va != (CUdeviceptr)ptr) continue;
    if (a->mapped) unmap(a);
    ok(cuMemAddressFree(a->va, a->size), "cuMemAddressFree");
    a->va = 0;
    ++frees;
    return;
  }
  fprintf(stderr, "cumem_pluggable: my_free of %p, never allocated\n", ptr);
  ++failures;
}

/* Bytes released / mapped again. */
size_t sleep_all(void) {
  size_t bytes = 0;
  for (int i = 0; i < MAX_ALLOCATIONS; ++i)
    if (table[i].va && table[i].mapped) {
      unmap(&table[i]);
      bytes += table[i].size;
    }
  return bytes;
}
size_t wake_all(void) {
  size_t bytes = 0;
  for (int i = 0; i < MAX_ALLOCATIONS; ++i)
    if (table[i].va && !table[i].mapped && map_at(&table[i])) bytes += table[i].size;
  return bytes;
}
int allocations(void) { return allocs; }
int deallocations(void) { return frees; }
int failed_calls(void) { return failures; }
