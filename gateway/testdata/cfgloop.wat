;; An ABI v1 policy that passes validation (empty config) but spins in choose once activated with any
;; config longer than "{}": a runaway that only shows in production. Healthy endpoints in snapshot order
;; otherwise. Built with: wat2wasm cfgloop.wat -o cfgloop.wasm (wabt 1.0.32)
(module
  (global $loop (mut i32) (i32.const 0))
  (memory (export "memory") 1)
  (func (export "kvgate_policy_abi_v1"))
  (func (export "kvgate_policy_abi_minor") (result i32) (i32.const 0))
  (func (export "kvgate_policy_buf") (result i32) (i32.const 1024))
  (func (export "kvgate_policy_buf_cap") (result i32) (i32.const 32768))
  (func (export "kvgate_policy_init") (param $len i32) (result i32)
    (global.set $loop (i32.gt_u (local.get $len) (i32.const 2)))
    (i32.const 0))
  (func (export "kvgate_policy_choose") (param $len i32) (result i32)
    (local $n i32) (local $i i32) (local $k i32)
    (if (global.get $loop) (then (loop $spin (br $spin))))
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
