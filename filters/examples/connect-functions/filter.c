/*
 * Example (seed 003): `to_upper` and `value_to_key` for the Kafka Connect Wasm ABI of
 * kafka-connect-wasm-transformer, runnable unmodified by Sluice (config `function: to_upper`).
 *
 * The guest exports memory, alloc(size) -> ptr, dealloc(ptr, size) and the entry points, which
 * take no arguments. It imports host functions from module "env": get_value() / get_key()
 * return (ptr << 32 | len) of a buffer the host filled through our alloc (we free it), and
 * set_value(ptr, len) / set_key(ptr, len) hand bytes back. No SDK: this ABI is the seed's.
 */
#include <stddef.h>
#include <stdint.h>

#define IMPORT(name) __attribute__((import_module("env"), import_name(name)))
IMPORT("get_value") int64_t get_value(void);
IMPORT("get_key") int64_t get_key(void);
IMPORT("set_value") void set_value(const uint8_t *ptr, int32_t len);
IMPORT("set_key") void set_key(const uint8_t *ptr, int32_t len);

/* A bump allocator that starts over once everything handed out has been freed: each entry
 * point frees what it got, so memory never accumulates across records. */
extern unsigned char __heap_base;
static uintptr_t top, limit;
static uint32_t live;

__attribute__((export_name("alloc"))) uint8_t *alloc(int32_t size) {
    if (top == 0 || live == 0) top = ((uintptr_t)&__heap_base + 15u) & ~(uintptr_t)15u;
    if (limit == 0) limit = (uintptr_t)__builtin_wasm_memory_size(0) * 65536u;
    uintptr_t p = (top + 7u) & ~(uintptr_t)7u;
    uintptr_t end = p + (size > 0 ? (uint32_t)size : 1u);
    if (end > limit) {
        if (__builtin_wasm_memory_grow(0, (end - limit + 65535u) / 65536u) == (size_t)-1) return 0;
        limit = (uintptr_t)__builtin_wasm_memory_size(0) * 65536u;
    }
    top = end;
    live++;
    return (uint8_t *)p;
}

__attribute__((export_name("dealloc"))) void dealloc(uint8_t *ptr, int32_t size) {
    (void)ptr;
    (void)size;
    if (live) live--;
}

__attribute__((export_name("to_upper"))) void to_upper(void) {
    int64_t packed = get_value();
    uint8_t *p = (uint8_t *)(uintptr_t)(uint32_t)((uint64_t)packed >> 32);
    int32_t n = (int32_t)(uint32_t)packed;
    for (int32_t i = 0; i < n; i++) {
        if (p[i] >= 'a' && p[i] <= 'z') p[i] = (uint8_t)(p[i] - 32);
    }
    set_value(p, n);
    if (n) dealloc(p, n);
}

__attribute__((export_name("value_to_key"))) void value_to_key(void) {
    int64_t packed = get_value();
    uint8_t *p = (uint8_t *)(uintptr_t)(uint32_t)((uint64_t)packed >> 32);
    int32_t n = (int32_t)(uint32_t)packed;
    set_key(p, n);
    if (n) dealloc(p, n);
}
