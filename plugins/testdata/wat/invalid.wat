;; Always answers count n+1 with index 0 repeated: rejected on the samples.
;; Built with: wat2wasm invalid.wat -o ../invalid.wasm (wabt 1.0.32)
(module
  (memory (export "memory") 1)
  (func (export "kvgate_policy_abi_v1"))
  (func (export "kvgate_policy_abi_minor") (result i32) (i32.const 0))
  (func (export "kvgate_policy_buf") (result i32) (i32.const 1024))
  (func (export "kvgate_policy_buf_cap") (result i32) (i32.const 32768))
  (func (export "kvgate_policy_init") (param i32) (result i32) (i32.const 0))
  (func (export "kvgate_policy_choose") (param i32) (result i32)
    (i32.add (i32.load (i32.const 1036)) (i32.const 1)))
)
