package endpoints

import "time"

// Eject takes id out of routing until until (passive outlier ejection after consecutive failures): Load
// reports it unhealthy and Ejected whatever its probes say, until then.
func (s *Set) Eject(id string, until time.Time) {
	if st, ok := s.lookup(id); ok {
		st.ejectedUntil.Store(until.UnixNano())
	}
}

// applyEjection marks l ejected while st's ejection lasts.
func (st *state) applyEjection(l *Load) {
	u := st.ejectedUntil.Load()
	if u == 0 {
		return
	}
	if time.Now().UnixNano() >= u {
		st.ejectedUntil.CompareAndSwap(u, 0)
		return
	}
	l.Healthy, l.Ejected, l.EjectedUntil = false, true, time.Unix(0, u)
}
