;; Imports WASI path_open (filesystem access): refused at load, even though other WASI
;; functions have stubs.
(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "sluice_abi_version") (result i32) (i32.const 1))
  (func (export "sluice_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "sluice_filter") (param i32 i32) (result i64) (i64.const -1))
)
