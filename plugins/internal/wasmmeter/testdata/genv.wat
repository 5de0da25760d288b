;; Provides the global renumber.wasm imports (wazero host modules cannot export globals).
;; Built with: wat2wasm genv.wat -o genv.wasm (wabt 1.0.32)
(module (global (export "g") i32 (i32.const 2)))
