/* Reservoir C API: the caching allocator behind status codes.
 *
 * Every function returns RESERVOIR_OK (0) or an error code; on error,
 * reservoir_last_error() returns a message for the calling thread. No function
 * throws or aborts; the free path never fails silently and never crashes on a
 * foreign pointer. All functions use the process-wide allocator
 * (reservoir::Allocator::instance()).
 *
 * Any integer is accepted where a stream (uintptr_t) or a device (int) is asked
 * for: it is served, or refused with a status (an unknown device is
 * RESERVOIR_ERROR_INVALID_ARGUMENT).
 */
#ifndef RESERVOIR_RESERVOIR_H
#define RESERVOIR_RESERVOIR_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define RESERVOIR_C_API __declspec(dllexport)
#else
#define RESERVOIR_C_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum reservoir_status {
  RESERVOIR_OK = 0,
  RESERVOIR_ERROR_OUT_OF_MEMORY = 1,
  RESERVOIR_ERROR_INVALID_POINTER = 2,
  RESERVOIR_ERROR_INVALID_ARGUMENT = 3,
  RESERVOIR_ERROR_CONFIG = 4,
  RESERVOIR_ERROR_DEVICE = 5,
  RESERVOIR_ERROR_INTERNAL = 6,
  /* Reading or writing a file failed (trace, snapshot): the message names the path
   * and the OS reason. The allocator is unaffected. */
  RESERVOIR_ERROR_IO = 7
} reservoir_status;

/* The library's version, "MAJOR.MINOR.PATCH" (e.g. "0.1.0"); a static string. */
RESERVOIR_C_API const char* reservoir_version(void);

/* Message of the last error on this thread ("" if none). Valid until the next call. */
RESERVOIR_C_API const char* reservoir_last_error(void);
/* Name of a status code ("out_of_memory", ...). */
RESERVOIR_C_API const char* reservoir_status_name(reservoir_status status);

/* size is signed so that negative sizes from callers are caught, not wrapped.
 * size 0 gives *ptr = NULL. device -1 = current device. */
RESERVOIR_C_API reservoir_status reservoir_allocate(void** ptr, int64_t size, int device,
                                                    uintptr_t stream);
/* ptr NULL is ignored. */
RESERVOIR_C_API reservoir_status reservoir_free(void* ptr);
RESERVOIR_C_API reservoir_status reservoir_record_stream(void* ptr, uintptr_t stream);
/* The host waited for stream's work to finish (cudaStreamSynchronize, an event
 * synchronize, cudaDeviceSynchronize for each stream): frees pending on it complete
 * now (in every stream's cache; only the caches with frees pending on it are visited,
 * so the cost does not grow with the number of streams), and a trace being recorded
 * gets an "s,STREAM" line.
 * On the simulated device the report itself completes the stream's work (config
 * sim_completion, default host_waits; docs/simulated_device.md). device -1 = current. */
RESERVOIR_C_API reservoir_status reservoir_notify_host_wait(uintptr_t stream, int device);
/* Call before destroying a stream that memory was allocated or freed on: under
 * policy:compact the event that later reuse of its memory waits for is recorded on
 * the stream lazily, and recording on a destroyed stream is undefined in CUDA; this
 * records it now. With expandable segments, giving free pages back synchronizes the
 * stream that used them; after this call it waits for the device instead.
 * Afterwards the stream holds no host memory once its cache is empty. When none of
 * its blocks is allocated or waiting for another stream, an event is recorded on it
 * now, and its cached segments serve the next new stream once that event has passed
 * (no cudaFree, which waits for the whole device, and no new cudaMalloc); while more
 * than 8 released caches wait so, the oldest goes back to the device. Else the cache
 * goes back to the device once its blocks are all free and their waits done, noticed
 * by the next new stream, reservoir_release_stream or reservoir_empty_cache.
 * A program may make and release streams without bound at a constant cost each.
 * device -1 = current. */
RESERVOIR_C_API reservoir_status reservoir_release_stream(uintptr_t stream, int device);
/* Tags (docs/sleep.md): the calling thread's requests carry tag (1-63 letters,
 * digits, '_', '-', '.', ':') until the matching reservoir_pop_tag; private pools
 * made meanwhile (a CUDA graph's, a MemPool's) carry it too. Scopes nest. */
RESERVOIR_C_API reservoir_status reservoir_push_tag(const char* tag);
RESERVOIR_C_API reservoir_status reservoir_pop_tag(void);
typedef enum reservoir_sleep_mode {
  RESERVOIR_SLEEP_OFFLOAD = 0, /* contents kept in pinned host memory, restored by wake */
  RESERVOIR_SLEEP_DISCARD = 1  /* contents undefined after wake */
} reservoir_sleep_mode;
/* Gives the device memory under the tag's blocks back to the device once the work
 * that used it is done, keeping every address reserved (pointers and captured CUDA
 * graphs stay valid); reservoir_wake maps memory there again. An unknown tag, a tag
 * asleep already (or not asleep, for wake) and a capture under way are
 * RESERVOIR_ERROR_INVALID_ARGUMENT; a failed sleep or wake leaves the tag as it was.
 * While asleep, requests under the tag are refused; frees and record_stream work.
 * device -1 = current. */
RESERVOIR_C_API reservoir_status reservoir_sleep(const char* tag, int mode, int device);
RESERVOIR_C_API reservoir_status reservoir_wake(const char* tag, int device);
/* As reservoir_wake, the copies back enqueued on stream and not waited for: work on
 * stream (or work that waits for it) may use the memory at once. */
RESERVOIR_C_API reservoir_status reservoir_wake_async(const char* tag, uintptr_t stream,
                                                      int device);
typedef struct reservoir_tag_state {
  int asleep;
  int mode; /* reservoir_sleep_mode, while asleep */
  size_t allocated_bytes;
  size_t reserved_bytes;
  size_t asleep_bytes;
  size_t offloaded_bytes;
  size_t pools;
} reservoir_tag_state;
RESERVOIR_C_API reservoir_status reservoir_get_tag_state(const char* tag, int device,
                                                         reservoir_tag_state* out);
/* A wake keeps the pinned host buffers of an offload for the next offload (pinning is
 * its slow part); this frees them on every device, but those a tag asleep still uses
 * (stats key host_kept_bytes). */
RESERVOIR_C_API reservoir_status reservoir_empty_host_cache(void);
RESERVOIR_C_API reservoir_status reservoir_empty_cache(void);
RESERVOIR_C_API reservoir_status reservoir_set_memory_fraction(double fraction, int device);
RESERVOIR_C_API reservoir_status reservoir_get_memory_fraction(int device, double* fraction);
RESERVOIR_C_API reservoir_status reservoir_largest_cached_block(int device, size_t* bytes);
RESERVOIR_C_API reservoir_status reservoir_base_allocation(void* ptr, void** base, size_t* size);
RESERVOIR_C_API reservoir_status reservoir_reset_peak_stats(int device);
RESERVOIR_C_API reservoir_status reservoir_reset_accumulated_stats(int device);
/* Applies "key:value,..." (PYTORCH_CUDA_ALLOC_CONF syntax) at run time.
 * RESERVOIR_ERROR_CONFIG, changing nothing, for a bad entry, for settings that
 * cannot apply together (policy:compact with expandable_segments:True or
 * backend:cudaMallocAsync) and for a change of backend, device or sim_capacity
 * (read once, when the allocator is made). */
RESERVOIR_C_API reservoir_status reservoir_update_config(const char* text);
/* As PyTorch's torch.cuda.memory._set_allocator_settings: max_split_size_mb,
 * roundup_power2_divisions and garbage_collection_threshold go back to their
 * defaults unless text names them; otherwise as reservoir_update_config. */
RESERVOIR_C_API reservoir_status reservoir_set_allocator_settings(const char* text);
/* Out-of-memory observers (PyTorch's attachOutOfMemoryObserver): fn is called with
 * ctx on every out-of-memory error of any device, just before the call that failed
 * returns RESERVOIR_ERROR_OUT_OF_MEMORY: the device, the bytes the request needed,
 * the bytes the device allows (its memory fraction's bound when one is set, else
 * its total) and the bytes the device reported free. It is called without the
 * allocator's locks, on the thread that asked: it may call Reservoir (statistics,
 * a snapshot, empty_cache), not allocate on the device that ran out. Observers stay
 * attached for the life of the process (ctx must stay valid), called in the order
 * attached. A NULL fn is RESERVOIR_ERROR_INVALID_ARGUMENT. */
typedef void (*reservoir_oom_observer_fn)(void* ctx, int device, size_t alloc_size, size_t allowed,
                                          size_t free_bytes);
RESERVOIR_C_API reservoir_status reservoir_attach_oom_observer(reservoir_oom_observer_fn fn,
                                                               void* ctx);
RESERVOIR_C_API reservoir_status reservoir_device_count(int* count);
/* Name of the device backend in use ("cuda", "sim"); creates the allocator. The
 * string is static. */
RESERVOIR_C_API reservoir_status reservoir_backend_name(const char** name);
/* The calling thread's current device (what device -1 means elsewhere). */
RESERVOIR_C_API reservoir_status reservoir_current_device(int* device);
/* The configuration in force as "key:value,...": the settings that differ from the
 * defaults, each once, in docs/config.md's order ("" for all defaults); updating a
 * default configuration with it gives the same configuration. The buffer convention
 * of reservoir_stats_text. */
RESERVOIR_C_API reservoir_status reservoir_config_text(char* buffer, size_t capacity,
                                                       size_t* needed);

/* Statistics as "name value\n" lines with PyTorch's memory_stats() keys
 * ("allocated_bytes.all.current 1024\n..."). Writes at most capacity bytes
 * including the terminating NUL; *needed gets the full length + 1. A buffer that
 * is too small (or NULL with capacity 0: the size query) gets the truncated text and
 * RESERVOIR_OK: compare *needed with capacity. A NULL buffer with a capacity other
 * than 0 is RESERVOIR_ERROR_INVALID_ARGUMENT. */
RESERVOIR_C_API reservoir_status reservoir_stats_text(int device, char* buffer, size_t capacity,
                                                      size_t* needed);
/* The memory summary table, same buffer convention. */
RESERVOIR_C_API reservoir_status reservoir_summary(int device, char* buffer, size_t capacity,
                                                   size_t* needed);
/* Bits of reservoir_summary_with_options' options. */
typedef enum reservoir_summary_option {
  /* Each statistic's row for all pools only (no "from large/small pool" rows). */
  RESERVOIR_SUMMARY_ABBREVIATED = 1,
  /* A line with the synchronizations of all streams and the max split size. */
  RESERVOIR_SUMMARY_SYNC_AND_SPLIT = 2
} reservoir_summary_option;
/* The summary table with options (0: reservoir_summary's table), same buffer
 * convention. An unknown bit is RESERVOIR_ERROR_INVALID_ARGUMENT. */
RESERVOIR_C_API reservoir_status reservoir_summary_with_options(int device, unsigned options,
                                                                char* buffer, size_t capacity,
                                                                size_t* needed);

/* Writes every request to path (docs/trace_format.md; ".gz" compresses), replacing
 * a running recording. The file is complete on disk after each buffer and written
 * out at exit. RESERVOIR_ERROR_IO when path cannot be created, and
 * RESERVOIR_ERROR_INVALID_ARGUMENT when it is NULL or empty; the running recording,
 * if any, then goes on. */
RESERVOIR_C_API reservoir_status reservoir_start_trace_recording(const char* path);
/* Writes out and closes the recording (nothing to do when none runs). */
RESERVOIR_C_API reservoir_status reservoir_stop_trace_recording(void);

/* History, snapshots and metrics (docs/observability.md). */
/* Keeps the last max_entries allocator events per device (enabled 0 stops and
 * clears them). No stack context is recorded through the C API. */
RESERVOIR_C_API reservoir_status reservoir_record_history(int enabled, size_t max_entries);
/* Writes the segments, blocks and history as a pickle that PyTorch's memory viewer
 * opens (the layout of torch.cuda.memory._snapshot()). */
RESERVOIR_C_API reservoir_status reservoir_dump_snapshot(const char* path);
/* Statistics of every device in the Prometheus text exposition format, and as
 * JSON; same buffer convention as reservoir_stats_text. */
RESERVOIR_C_API reservoir_status reservoir_metrics_prometheus(char* buffer, size_t capacity,
                                                              size_t* needed);
RESERVOIR_C_API reservoir_status reservoir_metrics_json(char* buffer, size_t capacity,
                                                        size_t* needed);

/* Private memory pools (docs/pools.md): CUDA graphs and memory pools keep their
 * memory apart from the default pools in them. A pool is named by two integers
 * (PyTorch's MempoolId_t); (0, 0) is the default pools. Unknown or released pools,
 * and uncached mode (RESERVOIR_NO_CACHING=1), are RESERVOIR_ERROR_INVALID_ARGUMENT. */
typedef struct reservoir_pool_id {
  uint64_t first;
  uint64_t second;
} reservoir_pool_id;
/* Bytes of reserved memory held by private pools, and how many pools exist (not in
 * reservoir_stats_text, whose keys are PyTorch's memory_stats() keys). */
RESERVOIR_C_API reservoir_status reservoir_private_pool_stats(int device, int64_t* reserved_bytes,
                                                              int64_t* pools);
/* A new pool with a fresh id (use count 1). use_on_oom: its free blocks may serve
 * other requests when the device is out of memory; no_split: its blocks are never
 * split. */
RESERVOIR_C_API reservoir_status reservoir_pool_create(int device, int use_on_oom, int no_split,
                                                       reservoir_pool_id* id);
/* A pool whose segments come from the program, not from the device (PyTorch's
 * MemPool(allocator=...)): alloc gives size bytes on device for a request on stream,
 * setting *ptr (non-NULL, 512-byte aligned) and returning RESERVOIR_OK, or returns
 * RESERVOIR_ERROR_OUT_OF_MEMORY when it has none; free gives back what alloc gave,
 * once no block of it is in use and the work submitted to stream has completed. Any
 * other status is a device error. Both get ctx, which must stay valid until the pool
 * has given back every segment (released, then emptied); neither may call Reservoir.
 * The pool splits and caches blocks inside those segments as any pool does. */
typedef reservoir_status (*reservoir_segment_alloc_fn)(void* ctx, int device, size_t size,
                                                       uintptr_t stream, void** ptr);
typedef reservoir_status (*reservoir_segment_free_fn)(void* ctx, int device, void* ptr, size_t size,
                                                      uintptr_t stream);
RESERVOIR_C_API reservoir_status reservoir_pool_create_with_source(
    int device, int use_on_oom, int no_split, reservoir_segment_alloc_fn alloc,
    reservoir_segment_free_fn free_fn, void* ctx, reservoir_pool_id* id);
/* A pool whose segments come from functions of the shape of PyTorch's
 * CUDAPluggableAllocator (torch.cuda.MemPool(allocator=...) over
 * torch.cuda.memory.CUDAPluggableAllocator(path, alloc, free), e.g. vLLM's cuMem
 * allocator): alloc(size, device, stream) returns the segment (NULL: none to be had,
 * an out-of-memory answer), free(ptr, size, device, stream) gives it back; stream is
 * the cudaStream_t. Otherwise as reservoir_pool_create_with_source (neither may call
 * Reservoir). */
typedef void* (*reservoir_pluggable_alloc_fn)(size_t size, int device, void* stream);
typedef void (*reservoir_pluggable_free_fn)(void* ptr, size_t size, int device, void* stream);
RESERVOIR_C_API reservoir_status reservoir_pool_create_with_pluggable(
    int device, int use_on_oom, int no_split, reservoir_pluggable_alloc_fn alloc,
    reservoir_pluggable_free_fn free_fn, reservoir_pool_id* id);
/* Creates the pool (use count 1) or adds a use; releasing drops one (at 0 the pool's
 * memory goes back once its blocks are freed, at the next empty_cache). */
RESERVOIR_C_API reservoir_status reservoir_pool_retain(int device, reservoir_pool_id id,
                                                       int use_on_oom, int no_split);
RESERVOIR_C_API reservoir_status reservoir_pool_release(int device, reservoir_pool_id id);
/* As reservoir_pool_release; when that was the last use, the pool's cached memory goes
 * back to the device now (its frees waiting for other streams waited for first), as
 * torch.cuda.MemPool's destructor does; not during a capture (then as
 * reservoir_pool_release). */
RESERVOIR_C_API reservoir_status reservoir_pool_release_and_empty(int device, reservoir_pool_id id);
RESERVOIR_C_API reservoir_status reservoir_pool_use_count(int device, reservoir_pool_id id,
                                                          int* count);
/* The bytes the pool's segments hold (reserved) and those of its allocated blocks, now
 * (a released pool's too, until it is forgotten); either out may be NULL. */
RESERVOIR_C_API reservoir_status reservoir_pool_usage(int device, reservoir_pool_id id,
                                                      size_t* reserved, size_t* allocated);
/* Routes requests on stream (a capture: frees deferred, nothing returned to the
 * device until the end), or the calling thread's requests, to the pool until
 * reservoir_pool_end. */
RESERVOIR_C_API reservoir_status reservoir_pool_begin_capture(int device, reservoir_pool_id id,
                                                              uintptr_t stream);
RESERVOIR_C_API reservoir_status reservoir_pool_begin_thread(int device, reservoir_pool_id id);
RESERVOIR_C_API reservoir_status reservoir_pool_end(int device, reservoir_pool_id id);
/* Whether the pool's allocated blocks are exactly ptrs[0..count). */
RESERVOIR_C_API reservoir_status reservoir_pool_live_allocations_are(int device,
                                                                     reservoir_pool_id id,
                                                                     void* const* ptrs,
                                                                     size_t count, int* result);
/* Checkpoints: the pool's state, taken and restored. A restore frees every allocated
 * block of the pool and allocates those the checkpoint records; its result lists
 * both (which: 0 freed, 1 allocated). Handles are freed by the caller. */
typedef struct reservoir_pool_checkpoint reservoir_pool_checkpoint;
typedef struct reservoir_pool_restore reservoir_pool_restore;
RESERVOIR_C_API reservoir_status reservoir_pool_checkpoint_take(int device, reservoir_pool_id id,
                                                                reservoir_pool_checkpoint** out);
RESERVOIR_C_API reservoir_status reservoir_pool_checkpoint_restore(
    const reservoir_pool_checkpoint* checkpoint, reservoir_pool_restore** out);
RESERVOIR_C_API void reservoir_pool_checkpoint_free(reservoir_pool_checkpoint* checkpoint);
RESERVOIR_C_API size_t reservoir_pool_restore_count(const reservoir_pool_restore* result,
                                                    int which);
/* NULL for an index out of range. */
RESERVOIR_C_API void* reservoir_pool_restore_pointer(const reservoir_pool_restore* result,
                                                     int which, size_t index);
RESERVOIR_C_API void reservoir_pool_restore_free(reservoir_pool_restore* result);
/* Sharing blocks with other processes (docs/ipc.md). The handle (bytes, and for a
 * block of an expandable segment one file descriptor per page) travels over a
 * connected Unix socket, descriptors by SCM_RIGHTS. The sender keeps the block
 * allocated while receivers use it; with keep != 0 a free of it is held back until
 * reservoir_unshare. RESERVOIR_ERROR_IO when the socket fails, INVALID_ARGUMENT for a
 * handle that is malformed or of a newer format version, INVALID_POINTER for a
 * pointer that is no allocated block (share) or was not opened (close). */
RESERVOIR_C_API reservoir_status reservoir_share(void* ptr, int socket, int keep);
RESERVOIR_C_API reservoir_status reservoir_unshare(void* ptr);
/* Receives one handle from socket and maps the block on device (-1: current); repeated
 * opens of the same memory return the same address. */
RESERVOIR_C_API reservoir_status reservoir_open_shared(int socket, int device, void** ptr);
/* Lets go of one open; the mapping goes with the last. */
RESERVOIR_C_API reservoir_status reservoir_close_shared(void* ptr);

/* Segments and their changes: what a communication library registers (NCCL's
 * ncclCommRegister, RDMA registration). A segment is a device allocation (or a run
 * of mapped pages of an expandable segment or of policy:compact's ranges): the same
 * segments a snapshot lists. */
typedef struct reservoir_segment {
  int device;
  uintptr_t address;
  size_t size;
  size_t allocated;       /* bytes of allocated blocks in it */
  size_t active;          /* allocated, and freed but still used by other streams */
  size_t requested;       /* bytes the program asked for in its allocated blocks */
  uintptr_t stream;       /* the stream of its last allocated block */
  int is_large;           /* of the large pool (blocks over 1 MiB) */
  int is_expandable;      /* pages mapped on demand (expandable segments, policy:compact) */
  reservoir_pool_id pool; /* the private pool owning it ({0, 0}: the default pools) */
} reservoir_segment;
/* The segments of device (-1: of every device) in address order: the first capacity
 * of them into out, and *count gets how many there are (out NULL with capacity 0:
 * the count query; NULL with a capacity is RESERVOIR_ERROR_INVALID_ARGUMENT). */
RESERVOIR_C_API reservoir_status reservoir_segments(int device, reservoir_segment* out,
                                                    size_t capacity, size_t* count);
/* What a trace entry records (the values of PyTorch's TraceEntry actions). */
typedef enum reservoir_trace_action {
  RESERVOIR_TRACE_ALLOC = 0,          /* a block was handed to the program */
  RESERVOIR_TRACE_FREE_REQUESTED = 1, /* the program freed it */
  RESERVOIR_TRACE_FREE_COMPLETED = 2, /* its memory is reusable */
  RESERVOIR_TRACE_SEGMENT_ALLOC = 3,  /* a device allocation */
  RESERVOIR_TRACE_SEGMENT_FREE = 4,   /* a device free */
  RESERVOIR_TRACE_SEGMENT_MAP = 5,    /* pages mapped (expandable, policy:compact) */
  RESERVOIR_TRACE_SEGMENT_UNMAP = 6,  /* pages unmapped */
  RESERVOIR_TRACE_SNAPSHOT = 7,       /* a snapshot was taken (size: active bytes) */
  RESERVOIR_TRACE_OOM = 8             /* out of memory (address: the device's free bytes) */
} reservoir_trace_action;
typedef struct reservoir_trace_entry {
  int action; /* a reservoir_trace_action */
  int device;
  uintptr_t address;
  size_t size;
  uintptr_t stream;
  uint64_t time_us; /* the backend's clock */
  reservoir_pool_id pool;
} reservoir_trace_entry;
/* Trace trackers (PyTorch's attachAllocatorTraceTracker): fn is called with ctx and
 * every entry of every device, whether or not history is kept, on the thread whose
 * call made it, once that call has let go of the allocator's locks and before it
 * returns (a tracker may register memory with a communication library, or call
 * Reservoir). The entry is valid during the call only. A SEGMENT_FREE or
 * SEGMENT_UNMAP entry comes after the memory went back: deregister what it names
 * then. Trackers stay attached for the life of the process (ctx must stay valid).
 * A NULL fn is RESERVOIR_ERROR_INVALID_ARGUMENT. */
typedef void (*reservoir_trace_tracker_fn)(void* ctx, const reservoir_trace_entry* entry);
RESERVOIR_C_API reservoir_status reservoir_attach_trace_tracker(reservoir_trace_tracker_fn fn,
                                                                void* ctx);

/* Runs the validator over every device; RESERVOIR_ERROR_INTERNAL on a violation. Safe
 * while other threads allocate, free, record streams or empty the cache: it checks one
 * consistent moment of each device (their calls on that device wait for it meanwhile),
 * so a report is a real violation. */
RESERVOIR_C_API reservoir_status reservoir_validate(void);

#ifdef __cplusplus
}
#endif

#endif /* RESERVOIR_RESERVOIR_H */
