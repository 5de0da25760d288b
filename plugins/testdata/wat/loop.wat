;; Always spins (for {}): validation must reject it (samples time out).
;; Built with: wat2wasm loop.wat -o ../loop.wasm (wabt 1.0.32)
(module
  (memory (export "memory") 1)
  (func (export "kvgate_policy_abi_v1"))
  (func (export "kvgate_policy_abi_minor") (result i32) (i32.const 0))
  (func (export "kvgate_policy_buf") (result i32) (i32.const 1024))
  (func (export "kvgate_policy_buf_cap") (result i32) (i32.const 32768))
  (func (export "kvgate_policy_init") (param i32) (result i32) (i32.const 0))
  (func (export "kvgate_policy_choose") (param i32) (result i32)
    (loop $spin (br $spin)) (i32.const 0))
)
