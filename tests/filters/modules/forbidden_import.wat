;; Imports a host function Sluice does not offer (a filter asking for a socket): refused at load.
(module
  (import "env" "open_socket" (func $open (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "sluice_abi_version") (result i32) (i32.const 1))
  (func (export "sluice_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "sluice_filter") (param i32 i32) (result i64)
    (drop (call $open (i32.const 0) (i32.const 0)))
    (i64.const -1))
)
