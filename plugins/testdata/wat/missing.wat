;; Lacks the ABI marker and choose exports: rejected statically.
;; Built with: wat2wasm missing.wat -o ../missing.wasm (wabt 1.0.32)
(module
  (memory (export "memory") 1)
  (func (export "kvgate_policy_abi_minor") (result i32) (i32.const 0))
  (func (export "kvgate_policy_buf") (result i32) (i32.const 1024))
  (func (export "kvgate_policy_buf_cap") (result i32) (i32.const 32768))
  (func (export "kvgate_policy_init") (param i32) (result i32) (i32.const 0)))
