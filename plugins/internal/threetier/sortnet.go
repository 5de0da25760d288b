package threetier

// Sorting networks for the fast path's packed keys: Batcher's odd-even merge sort for 8 inputs (19
// compare-exchanges, depth 6) and 16 inputs (63, depth 10), written out one compare-exchange per line
// (generated; TestSortNetworks checks both by the 0-1 principle: every 0/1 input comes out sorted).
//
// Go compiles min/max of uint64 to wasm's select, so a network is straight-line code: no loop and no
// branch, hence no trip through the dispatch loop Go's wasm code takes for every jump. The keys are
// loaded into local variables first: working through the array pointer reloaded the pointer from Go's
// stack and stored both outputs for every compare-exchange (measured: the 16-network took 16% of the
// guest's time that way, 8% with locals; the call 1.26 → 1.03 µs).

// sortNet8 sorts k ascending (19 compare-exchanges).
func sortNet8(k *[8]uint64) {
	k0, k1, k2, k3, k4, k5, k6, k7 := k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7]
	k0, k1 = min(k0, k1), max(k0, k1)
	k2, k3 = min(k2, k3), max(k2, k3)
	k4, k5 = min(k4, k5), max(k4, k5)
	k6, k7 = min(k6, k7), max(k6, k7)
	k0, k2 = min(k0, k2), max(k0, k2)
	k1, k3 = min(k1, k3), max(k1, k3)
	k4, k6 = min(k4, k6), max(k4, k6)
	k5, k7 = min(k5, k7), max(k5, k7)
	k1, k2 = min(k1, k2), max(k1, k2)
	k5, k6 = min(k5, k6), max(k5, k6)
	k0, k4 = min(k0, k4), max(k0, k4)
	k1, k5 = min(k1, k5), max(k1, k5)
	k2, k6 = min(k2, k6), max(k2, k6)
	k3, k7 = min(k3, k7), max(k3, k7)
	k2, k4 = min(k2, k4), max(k2, k4)
	k3, k5 = min(k3, k5), max(k3, k5)
	k1, k2 = min(k1, k2), max(k1, k2)
	k3, k4 = min(k3, k4), max(k3, k4)
	k5, k6 = min(k5, k6), max(k5, k6)
	k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7] = k0, k1, k2, k3, k4, k5, k6, k7
}

// sortNet16 sorts k ascending (63 compare-exchanges).
func sortNet16(k *[16]uint64) {
	k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11, k12, k13, k14, k15 := k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], k[8], k[9], k[10], k[11], k[12], k[13], k[14], k[15]
	k0, k1 = min(k0, k1), max(k0, k1)
	k2, k3 = min(k2, k3), max(k2, k3)
	k4, k5 = min(k4, k5), max(k4, k5)
	k6, k7 = min(k6, k7), max(k6, k7)
	k8, k9 = min(k8, k9), max(k8, k9)
	k10, k11 = min(k10, k11), max(k10, k11)
	k12, k13 = min(k12, k13), max(k12, k13)
	k14, k15 = min(k14, k15), max(k14, k15)
	k0, k2 = min(k0, k2), max(k0, k2)
	k1, k3 = min(k1, k3), max(k1, k3)
	k4, k6 = min(k4, k6), max(k4, k6)
	k5, k7 = min(k5, k7), max(k5, k7)
	k8, k10 = min(k8, k10), max(k8, k10)
	k9, k11 = min(k9, k11), max(k9, k11)
	k12, k14 = min(k12, k14), max(k12, k14)
	k13, k15 = min(k13, k15), max(k13, k15)
	k1, k2 = min(k1, k2), max(k1, k2)
	k5, k6 = min(k5, k6), max(k5, k6)
	k9, k10 = min(k9, k10), max(k9, k10)
	k13, k14 = min(k13, k14), max(k13, k14)
	k0, k4 = min(k0, k4), max(k0, k4)
	k1, k5 = min(k1, k5), max(k1, k5)
	k2, k6 = min(k2, k6), max(k2, k6)
	k3, k7 = min(k3, k7), max(k3, k7)
	k8, k12 = min(k8, k12), max(k8, k12)
	k9, k13 = min(k9, k13), max(k9, k13)
	k10, k14 = min(k10, k14), max(k10, k14)
	k11, k15 = min(k11, k15), max(k11, k15)
	k2, k4 = min(k2, k4), max(k2, k4)
	k3, k5 = min(k3, k5), max(k3, k5)
	k10, k12 = min(k10, k12), max(k10, k12)
	k11, k13 = min(k11, k13), max(k11, k13)
	k1, k2 = min(k1, k2), max(k1, k2)
	k3, k4 = min(k3, k4), max(k3, k4)
	k5, k6 = min(k5, k6), max(k5, k6)
	k9, k10 = min(k9, k10), max(k9, k10)
	k11, k12 = min(k11, k12), max(k11, k12)
	k13, k14 = min(k13, k14), max(k13, k14)
	k0, k8 = min(k0, k8), max(k0, k8)
	k1, k9 = min(k1, k9), max(k1, k9)
	k2, k10 = min(k2, k10), max(k2, k10)
	k3, k11 = min(k3, k11), max(k3, k11)
	k4, k12 = min(k4, k12), max(k4, k12)
	k5, k13 = min(k5, k13), max(k5, k13)
	k6, k14 = min(k6, k14), max(k6, k14)
	k7, k15 = min(k7, k15), max(k7, k15)
	k4, k8 = min(k4, k8), max(k4, k8)
	k5, k9 = min(k5, k9), max(k5, k9)
	k6, k10 = min(k6, k10), max(k6, k10)
	k7, k11 = min(k7, k11), max(k7, k11)
	k2, k4 = min(k2, k4), max(k2, k4)
	k3, k5 = min(k3, k5), max(k3, k5)
	k6, k8 = min(k6, k8), max(k6, k8)
	k7, k9 = min(k7, k9), max(k7, k9)
	k10, k12 = min(k10, k12), max(k10, k12)
	k11, k13 = min(k11, k13), max(k11, k13)
	k1, k2 = min(k1, k2), max(k1, k2)
	k3, k4 = min(k3, k4), max(k3, k4)
	k5, k6 = min(k5, k6), max(k5, k6)
	k7, k8 = min(k7, k8), max(k7, k8)
	k9, k10 = min(k9, k10), max(k9, k10)
	k11, k12 = min(k11, k12), max(k11, k12)
	k13, k14 = min(k13, k14), max(k13, k14)
	k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], k[8], k[9], k[10], k[11], k[12], k[13], k[14], k[15] = k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11, k12, k13, k14, k15
}
