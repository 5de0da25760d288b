;; Resource bomb: two memories (multi-memory). Rejected by wazero at compile (one memory at most).
;; Built with: wat2wasm --enable-all two-memories.wat -o ../two-memories.wasm (wabt 1.0.32)
(module
  (memory (export "memory") 1)
  (func (export "kvgate_policy_abi_v1"))
  (func (export "kvgate_policy_abi_minor") (result i32) (i32.const 0))
  (func (export "kvgate_policy_buf") (result i32) (i32.const 1024))
  (func (export "kvgate_policy_buf_cap") (result i32) (i32.const 32768))
  (func (export "kvgate_policy_init") (param i32) (result i32) (i32.const 0))
  (memory $m2 1)
  (func (export "kvgate_policy_choose") (param $len i32) (result i32)
    (local $n i32) (local $i i32) (local $k i32)

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
