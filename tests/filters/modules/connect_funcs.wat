;; Kafka Connect Wasm ABI test filter (kafka-connect-wasm-transformer style): entry points take
;; no arguments and pull/push record parts through host functions imported from "env".
;;   to_upper      value := upper-case(value)
;;   value_to_key  key := value
;;   header_to_key key := last header "the-key"
;;   copy_header   adds header "the-header-out" with the value of "the-header-in"
;;   record_echo   set_record(get_record())  (must change nothing)
;;   topic_same    set_topic(get_topic())    (allowed)
;;   topic_other   set_topic("other")        (a proxy cannot re-route: failure)
;;   fail          returns an i64 error: bit 31 of the low word set, message "boom"
;;   done_i64      returns a non-error i64 buffer; the host must dealloc it
;;   trap          unreachable
;;   pull_forever  calls get_value in an endless loop (the host's nested alloc calls must not
;;                 extend the call deadline)
(module
  (import "env" "get_value" (func $get_value (result i64)))
  (import "env" "set_value" (func $set_value (param i32 i32)))
  (import "env" "get_key" (func $get_key (result i64)))
  (import "env" "set_key" (func $set_key (param i32 i32)))
  (import "env" "get_header" (func $get_header (param i32 i32) (result i64)))
  (import "env" "set_header" (func $set_header (param i32 i32 i32 i32)))
  (import "env" "get_topic" (func $get_topic (result i64)))
  (import "env" "set_topic" (func $set_topic (param i32 i32)))
  (import "env" "get_record" (func $get_record (result i64)))
  (import "env" "set_record" (func $set_record (param i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "boom")
  (data (i32.const 32) "the-key")          ;; 7
  (data (i32.const 48) "the-header-in")    ;; 13
  (data (i32.const 64) "the-header-out")   ;; 14
  (data (i32.const 80) "other")            ;; 5
  (global $heap (mut i32) (i32.const 1024))
  (global $deallocs (export "deallocs") (mut i32) (i32.const 0))
  (func $alloc (export "alloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
      (then (if (i32.eq (memory.grow (i32.add (i32.div_u (local.get $n) (i32.const 65536))
                                             (i32.const 1)))
                        (i32.const -1))
              (then unreachable))))
    (local.get $p))
  (func (export "dealloc") (param i32 i32)
    (global.set $deallocs (i32.add (global.get $deallocs) (i32.const 1))))
  (func $ptr (param $r i64) (result i32) (i32.wrap_i64 (i64.shr_u (local.get $r) (i64.const 32))))
  (func $len (param $r i64) (result i32) (i32.wrap_i64 (local.get $r)))
  (func $reset (global.set $heap (i32.const 1024)))

  (func (export "to_upper")
    (local $r i64) (local $p i32) (local $n i32) (local $i i32) (local $c i32)
    (call $reset)
    (local.set $r (call $get_value))
    (local.set $p (call $ptr (local.get $r)))
    (local.set $n (call $len (local.get $r)))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $c (i32.load8_u (i32.add (local.get $p) (local.get $i))))
        (if (i32.and (i32.ge_u (local.get $c) (i32.const 97)) (i32.le_u (local.get $c) (i32.const 122)))
          (then (i32.store8 (i32.add (local.get $p) (local.get $i))
                            (i32.sub (local.get $c) (i32.const 32)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (call $set_value (local.get $p) (local.get $n)))

  (func (export "value_to_key")
    (local $r i64)
    (call $reset)
    (local.set $r (call $get_value))
    (call $set_key (call $ptr (local.get $r)) (call $len (local.get $r))))

  (func (export "header_to_key")
    (local $r i64)
    (call $reset)
    (local.set $r (call $get_header (i32.const 32) (i32.const 7)))
    (call $set_key (call $ptr (local.get $r)) (call $len (local.get $r))))

  (func (export "copy_header")
    (local $r i64)
    (call $reset)
    (local.set $r (call $get_header (i32.const 48) (i32.const 13)))
    (call $set_header (i32.const 64) (i32.const 14)
                      (call $ptr (local.get $r)) (call $len (local.get $r))))

  (func (export "record_echo")
    (local $r i64)
    (call $reset)
    (local.set $r (call $get_record))
    (call $set_record (call $ptr (local.get $r)) (call $len (local.get $r))))

  (func (export "topic_same")
    (local $r i64)
    (call $reset)
    (local.set $r (call $get_topic))
    (call $set_topic (call $ptr (local.get $r)) (call $len (local.get $r))))

  (func (export "topic_other")
    (call $reset)
    (call $set_topic (i32.const 80) (i32.const 5)))

  (func (export "fail") (result i64)
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 0x80000004)))

  (func (export "done_i64") (result i64)
    (local $p i32)
    (call $reset)
    (local.set $p (call $alloc (i32.const 8)))
    (i64.or (i64.shl (i64.extend_i32_u (local.get $p)) (i64.const 32)) (i64.const 8)))

  (func (export "trap") unreachable)

  (func (export "pull_forever")
    (loop $again
      (call $reset)
      (drop (call $get_value))
      (br $again)))
)
