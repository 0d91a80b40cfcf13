;; Test filter whose two entry points disagree, written by hand against docs/FILTER_ABI.md.
;; sluice_filter (ABI v1) keeps every record. sluice_filter_records claims to rewrite every
;; record but returns a records section of three garbage bytes ("xyz"), which the host must
;; catch (the codec's check of the section) and answer through sluice_filter instead.
;; When the topic is exactly "trap", sluice_filter_records traps instead.
;; Input always lands at 1024 (sluice_alloc); outputs are written at 0x80000.
(module
  (memory (export "memory") 16)
  (func (export "sluice_abi_version") (result i32) (i32.const 1))
  (func (export "sluice_alloc") (param $n i32) (result i32) (i32.const 1024))

  ;; Address of the u32 right after the three header strings (topic, client_id, principal):
  ;; version u32, direction u8, topic str, partition i32, client_id str, principal str.
  (func $after_strings (param $p i32) (result i32)
    (local $q i32)
    (local.set $q (i32.add (local.get $p) (i32.const 5)))                  ;; topic len
    (local.set $q (i32.add (i32.add (local.get $q) (i32.const 4))
                           (i32.load (local.get $q))))                       ;; after topic
    (local.set $q (i32.add (local.get $q) (i32.const 4)))                  ;; client_id len
    (local.set $q (i32.add (i32.add (local.get $q) (i32.const 4))
                           (i32.load (local.get $q))))                       ;; principal len
    (i32.add (i32.add (local.get $q) (i32.const 4)) (i32.load (local.get $q))))

  (func $is_trap_topic (param $p i32) (result i32)
    (i32.and
      (i32.eq (i32.load (i32.add (local.get $p) (i32.const 5))) (i32.const 4))
      (i32.eq (i32.load (i32.add (local.get $p) (i32.const 9)))
              (i32.const 0x70617274))))  ;; "trap" little-endian

  ;; v1 output: u32 count | count x keep | u32 0 detectors
  (func (export "sluice_filter") (param $p i32) (param $n i32) (result i64)
    (local $count i32)
    (local.set $count (i32.load (call $after_strings (local.get $p))))
    (i32.store (i32.const 0x80000) (local.get $count))
    (memory.fill (i32.const 0x80004) (i32.const 0) (local.get $count))
    (i32.store (i32.add (i32.const 0x80004) (local.get $count)) (i32.const 0))
    (i64.or (i64.shl (i64.const 0x80000) (i64.const 32))
            (i64.extend_i32_u (i32.add (local.get $count) (i32.const 8)))))

  ;; native output: u32 count | count x rewrite | i32 3 | "xyz" | u32 0 rejects | u32 0 detectors
  (func (export "sluice_filter_records") (param $p i32) (param $n i32) (result i64)
    (local $count i32)
    (local $w i32)
    (if (call $is_trap_topic (local.get $p)) (then unreachable))
    ;; after the strings: offset_base i64, timestamp_base i64, then the record count
    (local.set $count (i32.load (i32.add (call $after_strings (local.get $p)) (i32.const 16))))
    (i32.store (i32.const 0x80000) (local.get $count))
    (memory.fill (i32.const 0x80004) (i32.const 1) (local.get $count))
    (local.set $w (i32.add (i32.const 0x80004) (local.get $count)))
    (i32.store (local.get $w) (i32.const 3))
    (i32.store (i32.add (local.get $w) (i32.const 4)) (i32.const 0x7a7978))  ;; "xyz\0"
    (i32.store (i32.add (local.get $w) (i32.const 7)) (i32.const 0))
    (i32.store (i32.add (local.get $w) (i32.const 11)) (i32.const 0))
    (i64.or (i64.shl (i64.const 0x80000) (i64.const 32))
            (i64.extend_i32_u (i32.add (local.get $count) (i32.const 19))))))
