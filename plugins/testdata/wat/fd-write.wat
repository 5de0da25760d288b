;; Resource bomb: choose loops on fd_write(stdout) of one 6 MB iovec. Rejected: stopped at the warm-up deadline (output capped at StderrLimitBytes).
;; Built with: wat2wasm --enable-all fd-write.wat -o ../fd-write.wasm (wabt 1.0.32)
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
    (i32.store (i32.const 40000) (i32.const 0)) (i32.store (i32.const 40004) (i32.const 6000000))
    (loop $w (drop (call $fd_write (i32.const 1) (i32.const 40000) (i32.const 1) (i32.const 40008))) (br $w))
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
