// Command round-robin is an example kvgate routing policy: healthy endpoints in rotation, starting at
// Request.Seq mod the number of healthy endpoints. It ignores cache and load (the baseline every router
// is compared with). Stateless: the host's sequence number replaces a counter, so pooled instances agree.
package main

import "github.com/kvgate/kvgate/sdk"

// Policy is the round-robin policy. It takes no config.
type Policy struct {
	sdk.BasePolicy
	healthy []uint32
}

// Choose ranks the healthy endpoints starting at Seq mod their count, wrapping around.
func (p *Policy) Choose(s *sdk.Snapshot, r *sdk.Ranking) error {
	p.healthy = p.healthy[:0]
	for i := range s.Endpoints {
		if s.Endpoints[i].Healthy() {
			p.healthy = append(p.healthy, s.Endpoints[i].Index)
		}
	}
	n := uint64(len(p.healthy))
	if n == 0 {
		return nil
	}
	start := s.Request.Seq % n
	for k := uint64(0); k < n; k++ {
		r.Add(p.healthy[(start+k)%n])
	}
	return nil
}

func init() { sdk.Register(&Policy{}) }

func main() {}
