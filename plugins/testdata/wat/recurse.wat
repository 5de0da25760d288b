;; choose calls $f, which calls itself twice without a loop: rejected by the static call-graph check.
;; Built with: wat2wasm recurse.wat -o ../recurse.wasm (wabt 1.0.32)
(module
  (func $f (param i32) (result i32)
    (if (result i32) (i32.eqz (local.get 0))
      (then (i32.const 0))
      (else (i32.add (call $f (i32.sub (local.get 0) (i32.const 1))) (call $f (i32.sub (local.get 0) (i32.const 1)))))))
  (memory (export "memory") 1)
  (func (export "kvgate_policy_abi_v1"))
  (func (export "kvgate_policy_abi_minor") (result i32) (i32.const 0))
  (func (export "kvgate_policy_buf") (result i32) (i32.const 1024))
  (func (export "kvgate_policy_buf_cap") (result i32) (i32.const 32768))
  (func (export "kvgate_policy_init") (param i32) (result i32) (i32.const 0))
  (func (export "kvgate_policy_choose") (param i32) (result i32) (drop (call $f (i32.const 30))) (i32.const 0)))
