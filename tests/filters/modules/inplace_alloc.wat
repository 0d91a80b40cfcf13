;; In-place ABI test filter (the Redpanda-style seed): transform_record(payload, len, key, klen).
;; Same behaviour, but exports a bump allocator (alloc/dealloc), which the host must use.
;;   value "DROP..." -> -2 (drop)          value "FAIL..." -> -1 (error)
;;   value "LONG..." -> len + 10 (invalid: beyond the original)
;;   value "SHRINK..." -> 6 (keeps the first six bytes)
;;   value "TRAP..." -> unreachable
;;   otherwise: upper-case the value and the key in place, return len
(module
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (global $allocs (export "allocs") (mut i32) (i32.const 0))
  (func (export "alloc") (param $n i32) (result i32)
    (local $p i32)
    (global.set $allocs (i32.add (global.get $allocs) (i32.const 1)))
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
      (then (drop (memory.grow (i32.add (i32.div_u (local.get $n) (i32.const 65536)) (i32.const 1))))))
    (local.get $p))
  (func (export "dealloc") (param i32 i32))
  (func $upper (param $p i32) (param $n i32)
    (local $i i32) (local $c i32)
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $c (i32.load8_u (i32.add (local.get $p) (local.get $i))))
        (if (i32.and (i32.ge_u (local.get $c) (i32.const 97)) (i32.le_u (local.get $c) (i32.const 122)))
          (then (i32.store8 (i32.add (local.get $p) (local.get $i))
                            (i32.sub (local.get $c) (i32.const 32)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next))))
  (func (export "transform_record") (param $p i32) (param $n i32) (param $k i32) (param $kn i32)
                                    (result i64)
    (local $w i32)
    (local.set $w (if (result i32) (i32.ge_u (local.get $n) (i32.const 4))
                    (then (i32.load (local.get $p))) (else (i32.const 0))))
    (if (i32.eq (local.get $w) (i32.const 0x504F5244)) (then (return (i64.const -2))))   ;; DROP
    (if (i32.eq (local.get $w) (i32.const 0x4C494146)) (then (return (i64.const -1))))   ;; FAIL
    (if (i32.eq (local.get $w) (i32.const 0x474E4F4C))                                   ;; LONG
      (then (return (i64.extend_i32_u (i32.add (local.get $n) (i32.const 10))))))
    (if (i32.eq (local.get $w) (i32.const 0x49524853)) (then (return (i64.const 6))))    ;; SHRI(NK)
    (if (i32.eq (local.get $w) (i32.const 0x50415254)) (then unreachable))               ;; TRAP
    (call $upper (local.get $p) (local.get $n))
    (call $upper (local.get $k) (local.get $kn))
    (i64.extend_i32_u (local.get $n)))
)
