;; Sluice ABI admin test filter: decides on the admin JSON by the resource name.
;;   name starts with "bad"  -> deny, message "name starts with bad"
;;   name starts with "big"  -> rewrite: partitions 3, configs {"retention.ms": "1000"}
;;   name starts with "junk" -> output that is not JSON (invalid output)
;;   name starts with "trap" -> unreachable
;;   otherwise               -> allow
;; Records: keeps everything (so it can also be bound to produce).
(module
  (memory (export "memory") 2)
  (data (i32.const 0) "\"name\":\"bad")                                    ;; 11
  (data (i32.const 16) "\"name\":\"big")                                   ;; 11
  (data (i32.const 32) "\"name\":\"junk")                                  ;; 12
  (data (i32.const 48) "\"name\":\"trap")                                  ;; 12
  (data (i32.const 64) "{\"decision\":\"deny\",\"message\":\"name starts with bad\"}")  ;; 52
  (data (i32.const 128) "{\"decision\":\"rewrite\",\"message\":\"capped\",\"partitions\":3,\"configs\":{\"retention.ms\":\"1000\"}}") ;; 90
  (data (i32.const 240) "{\"decision\":\"allow\"}")                        ;; 20
  (data (i32.const 272) "not json")                                        ;; 8
  (func (export "sluice_abi_version") (result i32) (i32.const 1))
  (func (export "sluice_alloc") (param i32) (result i32) (i32.const 65536))
  (func $find (param $h i32) (param $hn i32) (param $nd i32) (param $nn i32) (result i32)
    (local $i i32) (local $j i32)
    (block $none
      (loop $outer
        (br_if $none (i32.gt_s (i32.add (local.get $i) (local.get $nn)) (local.get $hn)))
        (local.set $j (i32.const 0))
        (block $miss
          (loop $inner
            (if (i32.ge_u (local.get $j) (local.get $nn)) (then (return (i32.const 1))))
            (br_if $miss (i32.ne (i32.load8_u (i32.add (i32.add (local.get $h) (local.get $i)) (local.get $j)))
                                 (i32.load8_u (i32.add (local.get $nd) (local.get $j)))))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))
            (br $inner)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $outer)))
    (i32.const 0))
  (func $packed (param $p i32) (param $n i32) (result i64)
    (i64.or (i64.shl (i64.extend_i32_u (local.get $p)) (i64.const 32)) (i64.extend_i32_u (local.get $n))))
  (func (export "sluice_admin") (param $in i32) (param $len i32) (result i64)
    (if (call $find (local.get $in) (local.get $len) (i32.const 0) (i32.const 11))
      (then (return (call $packed (i32.const 64) (i32.const 52)))))
    (if (call $find (local.get $in) (local.get $len) (i32.const 16) (i32.const 11))
      (then (return (call $packed (i32.const 128) (i32.const 90)))))
    (if (call $find (local.get $in) (local.get $len) (i32.const 32) (i32.const 12))
      (then (return (call $packed (i32.const 272) (i32.const 8)))))
    (if (call $find (local.get $in) (local.get $len) (i32.const 48) (i32.const 12))
      (then unreachable))
    (call $packed (i32.const 240) (i32.const 20)))
  ;; keep every record: count from the input header, then that many zero bytes
  (func (export "sluice_filter") (param $in i32) (param $len i32) (result i64)
    (local $pos i32) (local $n i32) (local $out i32)
    (local.set $pos (i32.add (local.get $in) (i32.const 5)))
    (local.set $pos (i32.add (i32.add (local.get $pos) (i32.const 4)) (i32.load (local.get $pos))))
    (local.set $pos (i32.add (local.get $pos) (i32.const 4)))
    (local.set $pos (i32.add (i32.add (local.get $pos) (i32.const 4)) (i32.load (local.get $pos))))
    (local.set $pos (i32.add (i32.add (local.get $pos) (i32.const 4)) (i32.load (local.get $pos))))
    (local.set $n (i32.load (local.get $pos)))
    (local.set $out (i32.add (local.get $in) (local.get $len)))
    (i32.store (local.get $out) (local.get $n))
    (memory.fill (i32.add (local.get $out) (i32.const 4)) (i32.const 0) (local.get $n))
    (call $packed (local.get $out) (i32.add (local.get $n) (i32.const 4))))
)
