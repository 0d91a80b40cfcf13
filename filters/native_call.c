/* A Sluice-ABI guest's `sluice_filter_records` call in one crossing (nc_call_run, used by
 * filters/native_call.py): sluice_alloc asked for the input's place, the input (head, then the
 * records) written there, the deadline armed and the export called through
 * wasmtime_func_call_unchecked, and, for a guest that took the host_sha256 capability, the
 * host's SHA-256 pass (hs_run in filters/host_sha256.c, reached through the address handed in:
 * this module does not link against libcrypto). From Python these were a ctypes call for the
 * alloc, up to four ctypes calls and a memmove (or a join) for the input, the records call
 * through RawFunc, and two ctypes calls more for the output's view, with the Python between
 * them. Nothing links against wasmtime either: its functions' addresses are handed in.
 *
 * Compiled at install (filters/native_call_build.py, cffi API mode, plain C).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* What stays the same from call to call, filled once per instance (native_call.NativeCall). */
typedef struct {
    uintptr_t call_fn;     /* wasmtime_func_call_unchecked */
    uintptr_t deadline_fn; /* wasmtime_context_set_epoch_deadline */
    uintptr_t data_fn, size_fn; /* wasmtime_memory_data, wasmtime_memory_data_size */
    uintptr_t store;   /* wasmtime_context_t * */
    uintptr_t func;    /* the records export's wasmtime_func_t * */
    uintptr_t args;    /* its wasmtime_val_raw_t[nargs]: (ptr, len) in, the i64 result out */
    uint64_t nargs;
    uintptr_t trap;    /* wasm_trap_t **: where wasmtime puts a trap */
    uintptr_t memory;  /* the guest's wasmtime_memory_t * */
    uint32_t slot;     /* the guest's hash request slot; 0: no pass */
    uintptr_t pass_fn; /* hs_run, when slot is not 0 */
    uintptr_t error;   /* out: the wasmtime_error_t * of a failed call, else 0 */
    int64_t result;    /* out: the guest's result, when the call did not fail */
    uintptr_t base;    /* out: guest memory's address and size after the call */
    uint64_t size;
    uintptr_t alloc;      /* sluice_alloc's wasmtime_func_t * */
    uintptr_t alloc_args; /* its wasmtime_val_raw_t[alloc_nargs]: the size in, the i32 out */
    uint64_t alloc_nargs;
    uint64_t alloc_ticks; /* its deadline (a call of its own, without the records' extra) */
    uint32_t ptr;         /* out: where the input went */
} nc_call;

#define NC_FAILED (-100) /* an error or a trap: error / *trap say which; no pass */
#define NC_INPUT (-101)  /* the input does not fit at ptr: nothing written, no call */
#define NC_ALLOC (-102)  /* sluice_alloc returned 0: nothing written, no call */

typedef void *(*nc_call_unchecked_fn)(void *store, const void *func, void *args, size_t n,
                                      void **trap);
typedef void (*nc_deadline_fn)(void *store, uint64_t ticks);
typedef uint8_t *(*nc_memory_data_fn)(const void *store, const void *memory);
typedef size_t (*nc_memory_size_fn)(const void *store, const void *memory);
typedef long (*nc_pass_fn)(uintptr_t mem_addr, uint64_t mem_size, uint32_t slot, uint32_t out_ptr,
                           uint32_t out_len, uint32_t records);

/* With `ptr` 0, first asks sluice_alloc for `len` bytes (its own deadline, when `ticks`
 * arms one) and puts the answer in c->ptr. Then writes `head` and `rest` at `ptr` in guest
 * memory, arms the deadline at `ticks` (0: leaves it, a nested call), calls the export with
 * (ptr, len), and, with a slot, runs the pass when it returned a result >= 0. NC_ALLOC,
 * NC_INPUT, NC_FAILED, or 0 (no slot, or the guest's error: the pass not run), or the pass's
 * answer (the number of digests written, or its negative code). */
long nc_call_run(nc_call *c, uint64_t ticks, uint32_t ptr, uint32_t len, const char *head,
                 size_t head_len, const char *rest, size_t rest_len, uint32_t records) {
    const void *st = (const void *)c->store, *m = (const void *)c->memory;
    if (!ptr) {
        int64_t *a = (int64_t *)c->alloc_args;
        a[0] = len;
        if (ticks) ((nc_deadline_fn)c->deadline_fn)((void *)c->store, c->alloc_ticks);
        void *err = ((nc_call_unchecked_fn)c->call_fn)((void *)c->store, (const void *)c->alloc,
                                                       a, (size_t)c->alloc_nargs, (void **)c->trap);
        c->error = (uintptr_t)err;
        if (err || *(void **)c->trap) return NC_FAILED;
        ptr = (uint32_t)a[0]; /* the i32 result in the low half */
        c->ptr = ptr;
        if (!ptr) return NC_ALLOC;
    }
    if (head_len + rest_len) {
        uint8_t *base = ((nc_memory_data_fn)c->data_fn)(st, m);
        size_t size = ((nc_memory_size_fn)c->size_fn)(st, m);
        uint64_t n = (uint64_t)head_len + rest_len;
        if (ptr > size || n > size - ptr) return NC_INPUT;
        memcpy(base + ptr, head, head_len);
        memcpy(base + ptr + head_len, rest, rest_len);
    }
    int64_t *args = (int64_t *)c->args; /* 16-byte unions, an i32 in the low half (little-endian) */
    args[0] = ptr;
    args[2] = len;
    if (ticks) ((nc_deadline_fn)c->deadline_fn)((void *)c->store, ticks);
    void *err = ((nc_call_unchecked_fn)c->call_fn)((void *)c->store, (const void *)c->func,
                                                   args, (size_t)c->nargs, (void **)c->trap);
    c->error = (uintptr_t)err;
    if (err || *(void **)c->trap) return NC_FAILED;
    int64_t result = args[0];
    c->result = result;
    uint8_t *base = ((nc_memory_data_fn)c->data_fn)(st, m); /* the call may have grown it */
    size_t size = ((nc_memory_size_fn)c->size_fn)(st, m);
    c->base = (uintptr_t)base;
    c->size = size;
    if (result < 0 || !c->slot) return 0;
    return ((nc_pass_fn)c->pass_fn)((uintptr_t)base, (uint64_t)size, c->slot,
                                     (uint32_t)((uint64_t)result >> 32), (uint32_t)result, records);
}
