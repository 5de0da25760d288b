//go:build wasip1

package sdk

import "unsafe"

// buffer is the fixed region the host writes snapshots and configs into and reads rankings from.
var buffer [BufferSize]byte

//go:wasmexport kvgate_policy_abi_v1
func exportMarker() {}

//go:wasmexport kvgate_policy_abi_minor
func exportMinor() int32 { return declaredMinor() }

//go:wasmexport kvgate_policy_buf
func exportBuf() int32 { return int32(uintptr(unsafe.Pointer(&buffer[0]))) }

//go:wasmexport kvgate_policy_buf_cap
func exportBufCap() int32 { return BufferSize }

//go:wasmexport kvgate_policy_init
func exportInit(n int32) int32 {
	if n < 0 || n > BufferSize {
		return ErrCodeMalformed
	}
	return registered.handleInit(buffer[:n])
}

//go:wasmexport kvgate_policy_choose
func exportChoose(n int32) int32 {
	return registered.handleChoose(buffer[:], int(n))
}
