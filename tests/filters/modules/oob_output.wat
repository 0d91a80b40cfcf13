;; Returns an output buffer that lies outside linear memory: the host must refuse to read it
;; (invalid output -> failure policy), never crash.
(module
  (memory (export "memory") 1)
  (func (export "sluice_abi_version") (result i32) (i32.const 1))
  (func (export "sluice_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "sluice_filter") (param i32 i32) (result i64)
    (i64.or (i64.shl (i64.const 60000) (i64.const 32)) (i64.const 10000)))
)
