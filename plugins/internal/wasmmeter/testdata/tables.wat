;; Table limits (TestTableLimits): a table whose minimum is MaxTableElements, and table.grow on a table
;; whose maximum is MaxTableElements, are accepted; one element more in either is ErrLimit.
;; Built with: wat2wasm tables.wat -o tables.wasm (wabt 1.0.32)
(module
  (table $t 1 1048576 funcref)
  (func (export "grow") (param i32) (result i32)
    (table.grow $t (ref.null func) (local.get 0)))
)
