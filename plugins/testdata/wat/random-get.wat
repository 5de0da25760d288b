;; Resource bomb: choose loops on random_get over 6 MB (a 32 MB variant ran over 120 s before random_get was charged). Rejected: stopped at the warm-up deadline.
;; Built with: wat2wasm --enable-all random-get.wat -o ../random-get.wasm (wabt 1.0.32)
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get" (func $random_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (func (export "kvgate_policy_abi_v1"))
  (func (export "kvgate_policy_abi_minor") (result i32) (i32.const 0))
  (func (export "kvgate_policy_buf") (result i32) (i32.const 1024))
  (func (export "kvgate_policy_buf_cap") (result i32) (i32.const 32768))
  (func (export "kvgate_policy_init") (param i32) (result i32) (i32.const 0))
  (func (export "kvgate_policy_choose") (param $len i32) (result i32)
    (local $n i32) (local $i i32) (local $k i32)
    (drop (memory.grow (i32.const 100)))
    (loop $w (drop (call $random_get (i32.const 65536) (i32.const 6000000))) (br $w))
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
