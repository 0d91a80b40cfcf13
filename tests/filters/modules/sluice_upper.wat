;; Sluice ABI v1 test filter, written by hand against docs/FILTER_ABI.md.
;;
;; Per record, by the first bytes of its value:
;;   "DROP..."   -> drop             "REJECT..." -> reject, reason "marker REJECT"
;;   "TRAP..."   -> unreachable      "LOOP..."   -> loops forever
;;   "GROW..."   -> grows memory until refused, then traps
;;   "BADOUT..." -> returns output with a wrong record count
;;   "ERR..."    -> returns -1 (sluice_last_error: "asked to fail")
;;   null value or no lowercase ASCII -> keep
;;   otherwise   -> rewrite: same key and headers, value upper-cased (ASCII)
;; Detector "upper" counts rewritten records.
;; A global guards against reuse after a trap: sluice_filter sets it on entry and clears it on
;; return, and fails ("state corrupt") if it finds it set.
;; sluice_init fails (code 3) when the config JSON is exactly {"fail":true}; it records the
;; config length, which "CFGLEN..." values return as the detector "cfglen".
(module
  (memory (export "memory") 2)
  (global $busy (mut i32) (i32.const 0))
  (global $cfglen (mut i32) (i32.const 0))
  (global $err (mut i32) (i32.const 0))
  (data (i32.const 0) "{\"fail\":true}")          ;; 13 bytes at 0
  (data (i32.const 32) "marker REJECT")            ;; 13 bytes at 32
  (data (i32.const 64) "upper")                    ;; 5 bytes at 64
  (data (i32.const 80) "state corrupt")            ;; 13 bytes at 80
  (data (i32.const 96) "asked to fail")            ;; 13 bytes at 96
  (data (i32.const 112) "config says fail")        ;; 16 bytes at 112
  (data (i32.const 128) "cfglen")                  ;; 6 bytes at 128

  (func (export "sluice_abi_version") (result i32) (i32.const 1))

  ;; Inputs always start at 64 KiB; make sure twice the size plus slack fits after it.
  (func $ensure (param $end i32)
    (local $have i32)
    (local.set $have (i32.mul (memory.size) (i32.const 65536)))
    (if (i32.gt_u (local.get $end) (local.get $have))
      (then
        (if (i32.eq
              (memory.grow (i32.add (i32.div_u (i32.sub (local.get $end) (local.get $have))
                                               (i32.const 65536)) (i32.const 1)))
              (i32.const -1))
          (then unreachable)))))

  (func (export "sluice_alloc") (param $size i32) (result i32)
    (call $ensure (i32.add (i32.const 65536)
                           (i32.add (i32.mul (local.get $size) (i32.const 3)) (i32.const 4096))))
    (i32.const 65536))

  (func (export "sluice_last_error") (result i64)
    (if (result i64) (i32.eq (global.get $err) (i32.const 1))
      (then (i64.or (i64.shl (i64.const 80) (i64.const 32)) (i64.const 13)))
      (else (if (result i64) (i32.eq (global.get $err) (i32.const 3))
        (then (i64.or (i64.shl (i64.const 112) (i64.const 32)) (i64.const 16)))
        (else (i64.or (i64.shl (i64.const 96) (i64.const 32)) (i64.const 13)))))))

  (func $eq (param $a i32) (param $b i32) (param $n i32) (result i32)
    (local $i i32)
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (if (i32.ne (i32.load8_u (i32.add (local.get $a) (local.get $i)))
                    (i32.load8_u (i32.add (local.get $b) (local.get $i))))
          (then (return (i32.const 0))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (i32.const 1))

  (func (export "sluice_init") (param $p i32) (param $n i32) (result i32)
    (global.set $cfglen (local.get $n))
    (if (i32.and (i32.eq (local.get $n) (i32.const 13))
                 (call $eq (local.get $p) (i32.const 0) (i32.const 13)))
      (then (global.set $err (i32.const 3)) (return (i32.const 3))))
    (i32.const 0))

  ;; skip a `str`/`bytes?` field at $pos, return the position after it
  (func $skip (param $pos i32) (result i32)
    (local $n i32)
    (local.set $n (i32.load (local.get $pos)))
    (if (result i32) (i32.eq (local.get $n) (i32.const -1))
      (then (i32.add (local.get $pos) (i32.const 4)))
      (else (i32.add (i32.add (local.get $pos) (i32.const 4)) (local.get $n)))))

  (func $has_lower (param $p i32) (param $n i32) (result i32)
    (local $i i32) (local $c i32)
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $c (i32.load8_u (i32.add (local.get $p) (local.get $i))))
        (if (i32.and (i32.ge_u (local.get $c) (i32.const 97)) (i32.le_u (local.get $c) (i32.const 122)))
          (then (return (i32.const 1))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (i32.const 0))

  (func $upper_copy (param $dst i32) (param $src i32) (param $n i32)
    (local $i i32) (local $c i32)
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $c (i32.load8_u (i32.add (local.get $src) (local.get $i))))
        (if (i32.and (i32.ge_u (local.get $c) (i32.const 97)) (i32.le_u (local.get $c) (i32.const 122)))
          (then (local.set $c (i32.sub (local.get $c) (i32.const 32)))))
        (i32.store8 (i32.add (local.get $dst) (local.get $i)) (local.get $c))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next))))

  (func (export "sluice_filter") (param $in i32) (param $len i32) (result i64)
    (local $pos i32) (local $n i32) (local $i i32) (local $out i32) (local $o i32)
    (local $kstart i32) (local $vlen i32) (local $vstart i32) (local $hstart i32)
    (local $hc i32) (local $h i32) (local $word i32) (local $upper i32) (local $cfg i32)
    (if (global.get $busy)
      (then (global.set $err (i32.const 1)) (return (i64.const -1))))
    (global.set $busy (i32.const 1))
    (global.set $err (i32.const 0))
    (local.set $out (i32.and (i32.add (i32.add (local.get $in) (local.get $len)) (i32.const 15))
                             (i32.const -16)))
    ;; header: version, direction, topic, partition, client_id, principal, count
    (local.set $pos (i32.add (local.get $in) (i32.const 5)))
    (local.set $pos (call $skip (local.get $pos)))
    (local.set $pos (i32.add (local.get $pos) (i32.const 4)))
    (local.set $pos (call $skip (local.get $pos)))
    (local.set $pos (call $skip (local.get $pos)))
    (local.set $n (i32.load (local.get $pos)))
    (local.set $pos (i32.add (local.get $pos) (i32.const 4)))
    (i32.store (local.get $out) (local.get $n))
    (local.set $o (i32.add (local.get $out) (i32.const 4)))
    (block $records_done
      (loop $record
        (br_if $records_done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $pos (i32.add (local.get $pos) (i32.const 16)))
        (local.set $kstart (local.get $pos))
        (local.set $pos (call $skip (local.get $pos)))
        (local.set $vlen (i32.load (local.get $pos)))
        (local.set $vstart (i32.add (local.get $pos) (i32.const 4)))
        (local.set $pos (call $skip (local.get $pos)))
        (local.set $hstart (local.get $pos))
        (local.set $hc (i32.load (local.get $pos)))
        (local.set $pos (i32.add (local.get $pos) (i32.const 4)))
        (local.set $h (i32.const 0))
        (block $hdone
          (loop $hnext
            (br_if $hdone (i32.ge_u (local.get $h) (local.get $hc)))
            (local.set $pos (call $skip (local.get $pos)))
            (local.set $pos (call $skip (local.get $pos)))
            (local.set $h (i32.add (local.get $h) (i32.const 1)))
            (br $hnext)))
        (local.set $word (if (result i32) (i32.ge_s (local.get $vlen) (i32.const 4))
                           (then (i32.load (local.get $vstart))) (else (i32.const 0))))
        (block $decided
          ;; "DROP"
          (if (i32.eq (local.get $word) (i32.const 0x504F5244))
            (then (i32.store8 (local.get $o) (i32.const 2))
                  (local.set $o (i32.add (local.get $o) (i32.const 1)))
                  (br $decided)))
          ;; "REJECT"
          (if (i32.and (i32.eq (local.get $word) (i32.const 0x454A4552))
                       (i32.ge_s (local.get $vlen) (i32.const 6)))
            (then (if (i32.eq (i32.load16_u (i32.add (local.get $vstart) (i32.const 4)))
                              (i32.const 0x5443))
              (then (i32.store8 (local.get $o) (i32.const 3))
                    (i32.store (i32.add (local.get $o) (i32.const 1)) (i32.const 13))
                    (memory.copy (i32.add (local.get $o) (i32.const 5)) (i32.const 32) (i32.const 13))
                    (local.set $o (i32.add (local.get $o) (i32.const 18)))
                    (br $decided)))))
          ;; "TRAP"
          (if (i32.eq (local.get $word) (i32.const 0x50415254)) (then unreachable))
          ;; "LOOP"
          (if (i32.eq (local.get $word) (i32.const 0x504F4F4C))
            (then (loop $forever (br $forever))))
          ;; "GROW"
          (if (i32.eq (local.get $word) (i32.const 0x574F5247))
            (then (loop $more
                    (br_if $more (i32.ne (memory.grow (i32.const 1)) (i32.const -1))))
                  unreachable))
          ;; "BADO"(UT): claim one record more than we got
          (if (i32.eq (local.get $word) (i32.const 0x4F444142))
            (then (i32.store (local.get $out) (i32.add (local.get $n) (i32.const 1)))))
          ;; "ERR"
          (if (i32.eq (i32.and (local.get $word) (i32.const 0xFFFFFF)) (i32.const 0x525245))
            (then (global.set $busy (i32.const 0)) (return (i64.const -1))))
          ;; "CFGL"(EN): report the config length as a detector
          (if (i32.eq (local.get $word) (i32.const 0x4C474643))
            (then (local.set $cfg (i32.const 1))))
          ;; keep: null value or nothing to upper-case
          (if (if (result i32) (i32.eq (local.get $vlen) (i32.const -1))
                (then (i32.const 1))
                (else (i32.eqz (call $has_lower (local.get $vstart) (local.get $vlen)))))
            (then (i32.store8 (local.get $o) (i32.const 0))
                  (local.set $o (i32.add (local.get $o) (i32.const 1)))
                  (br $decided)))
          ;; rewrite: key as is, value upper-cased, headers as is
          (i32.store8 (local.get $o) (i32.const 1))
          (local.set $o (i32.add (local.get $o) (i32.const 1)))
          (memory.copy (local.get $o) (local.get $kstart)
                       (i32.sub (i32.sub (local.get $vstart) (i32.const 4)) (local.get $kstart)))
          (local.set $o (i32.add (local.get $o)
                       (i32.sub (i32.sub (local.get $vstart) (i32.const 4)) (local.get $kstart))))
          (i32.store (local.get $o) (local.get $vlen))
          (call $upper_copy (i32.add (local.get $o) (i32.const 4)) (local.get $vstart) (local.get $vlen))
          (local.set $o (i32.add (local.get $o) (i32.add (i32.const 4) (local.get $vlen))))
          (memory.copy (local.get $o) (local.get $hstart) (i32.sub (local.get $pos) (local.get $hstart)))
          (local.set $o (i32.add (local.get $o) (i32.sub (local.get $pos) (local.get $hstart))))
          (local.set $upper (i32.add (local.get $upper) (i32.const 1))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $record)))
    ;; detectors: "upper" always, "cfglen" when asked
    (i32.store (local.get $o) (i32.add (i32.const 1) (local.get $cfg)))
    (i32.store (i32.add (local.get $o) (i32.const 4)) (i32.const 5))
    (memory.copy (i32.add (local.get $o) (i32.const 8)) (i32.const 64) (i32.const 5))
    (i32.store (i32.add (local.get $o) (i32.const 13)) (local.get $upper))
    (local.set $o (i32.add (local.get $o) (i32.const 17)))
    (if (local.get $cfg)
      (then (i32.store (local.get $o) (i32.const 6))
            (memory.copy (i32.add (local.get $o) (i32.const 4)) (i32.const 128) (i32.const 6))
            (i32.store (i32.add (local.get $o) (i32.const 10)) (global.get $cfglen))
            (local.set $o (i32.add (local.get $o) (i32.const 14)))))
    (global.set $busy (i32.const 0))
    (i64.or (i64.shl (i64.extend_i32_u (local.get $out)) (i64.const 32))
            (i64.extend_i32_u (i32.sub (local.get $o) (local.get $out)))))
)
