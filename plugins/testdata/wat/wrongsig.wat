;; kvgate_policy_choose takes an i64: rejected statically.
;; Built with: wat2wasm wrongsig.wat -o ../wrongsig.wasm (wabt 1.0.32)
(module
  (memory (export "memory") 1)
  (func (export "kvgate_policy_abi_v1"))
  (func (export "kvgate_policy_abi_minor") (result i32) (i32.const 0))
  (func (export "kvgate_policy_buf") (result i32) (i32.const 1024))
  (func (export "kvgate_policy_buf_cap") (result i32) (i32.const 32768))
  (func (export "kvgate_policy_init") (param i32) (result i32) (i32.const 0))
  (func (export "kvgate_policy_choose") (param i64) (result i32) (i32.const 0))
)
