;; Resource bomb: choose polls stdin (fd 0, read) with a 10 s clock. Accepted: stdin is empty, nothing blocks.
;; Built with: wat2wasm --enable-all poll-stdin.wat -o ../poll-stdin.wasm (wabt 1.0.32)
(module
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "kvgate_policy_abi_v1"))
  (func (export "kvgate_policy_abi_minor") (result i32) (i32.const 0))
  (func (export "kvgate_policy_buf") (result i32) (i32.const 1024))
  (func (export "kvgate_policy_buf_cap") (result i32) (i32.const 32768))
  (func (export "kvgate_policy_init") (param i32) (result i32) (i32.const 0))
  (func (export "kvgate_policy_choose") (param $len i32) (result i32)
    (local $n i32) (local $i i32) (local $k i32)
    (i64.store (i32.const 2000) (i64.const 0)) (i32.store8 (i32.const 2008) (i32.const 1))
    (i32.store (i32.const 2016) (i32.const 0))
    (i64.store (i32.const 2048) (i64.const 0)) (i32.store8 (i32.const 2056) (i32.const 0))
    (i32.store (i32.const 2064) (i32.const 1)) (i64.store (i32.const 2072) (i64.const 10000000000))
    (drop (call $poll (i32.const 2000) (i32.const 3000) (i32.const 2) (i32.const 4000)))
    (local.set $n (i32.load (i32.const 1036)))
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (if (i32.and (i32.load (i32.add (i32.const 1092) (i32.mul (local.get $i) (i32.const 48)))) (i32.const 1))
          (then
            (i32.store (i32.add (i32.const 1024) (i32.shl (local.get $k) (i32.const 2))) (local.get $i))
            (local.set $k (i32.add (local.get $k) (i32.const 1)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
    (local.get $k))
)
