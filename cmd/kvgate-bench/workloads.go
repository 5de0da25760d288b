package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"
)

// A workload is a list of sessions; a session is one or more turns sent one after the other (the next
// turn after the previous answer plus the think time). Shared-prefix and trace workloads have one turn
// per session; multi-turn sessions resend the conversation so far, growing by each question and answer.
type workload struct {
	Name string // shared-prefix, multi-turn, trace
	Desc string // one line: the shape
	// Chat sends chat completions (system + conversation); otherwise completions with Prompt.
	Chat     bool
	Sessions []session
	// Timed is true when the sessions carry their own arrival offsets (a trace); else arrivals come from
	// the load generator.
	Timed bool
}

// session is one user's requests.
type session struct {
	At     time.Duration // arrival offset of the first turn (Timed workloads)
	System string        // chat: the system prompt ("" none); completions: the prompt's head
	Turns  []turn
	Think  time.Duration // wall time between an answer and the next turn
	Group  int           // shared-prefix: the group whose system prompt it sends (miss analysis); else 0
}

// turn is one request: a new user message (chat) or the whole prompt (completions, after System).
type turn struct {
	User      string
	MaxTokens int
}

// Requests is the number of requests (turns) in w.
func (w *workload) Requests() int {
	n := 0
	for _, s := range w.Sessions {
		n += len(s.Turns)
	}
	return n
}

// textSource makes prompt text of a given token length: words that are one token each with their
// leading space, so n words are n tokens and texts concatenate token for token.
type textSource struct {
	words []string
}

// Text returns n one-token words drawn from r.
func (s *textSource) Text(r *rand.Rand, n int) string {
	var b strings.Builder
	for range n {
		b.WriteString(s.words[r.IntN(len(s.words))])
	}
	return b.String()
}

// sharedPrefixShape is workload (a): G groups × U users, every user of a group sends the group's system
// prompt of S tokens plus its own question of Q tokens, asking for O output tokens, Rounds times.
type sharedPrefixShape struct {
	Groups, Users, System, Question, Output, Rounds int
}

// llm-d's shape (150 groups × 5 users, 6k system + 1.2k question), scaled down 10× in tokens, and the
// quick variant.
var (
	sharedPrefixFull  = sharedPrefixShape{Groups: 150, Users: 5, System: 600, Question: 120, Output: 16, Rounds: 1}
	sharedPrefixQuick = sharedPrefixShape{Groups: 16, Users: 4, System: 600, Question: 120, Output: 8, Rounds: 1}
)

// sharedPrefix builds workload (a). Requests are in a random order (seeded), so a group's users arrive
// spread over the run.
func sharedPrefix(src *textSource, sh sharedPrefixShape, chat bool, seed uint64) *workload {
	r := rand.New(rand.NewPCG(seed, 0xa))
	systems := make([]string, sh.Groups)
	for g := range systems {
		systems[g] = src.Text(r, sh.System)
	}
	var ss []session
	for range sh.Rounds {
		for g := range sh.Groups {
			for range sh.Users {
				ss = append(ss, session{System: systems[g], Group: g, Turns: []turn{{User: src.Text(r, sh.Question),
					MaxTokens: sh.Output}}})
			}
		}
	}
	r.Shuffle(len(ss), func(i, j int) { ss[i], ss[j] = ss[j], ss[i] })
	return &workload{Name: "shared-prefix", Chat: chat, Sessions: ss,
		Desc: fmt.Sprintf("%d groups × %d users × %d round(s), %d-token system prompt, %d-token question, %d output tokens",
			sh.Groups, sh.Users, sh.Rounds, sh.System, sh.Question, sh.Output)}
}

// multiTurnShape is workload (b): Sessions conversations of Turns turns (uniform in [Turns/2, Turns]),
// each turn a Question-token message and Output tokens of answer, Think between turns; sessions share one
// of Systems system prompts of System tokens.
type multiTurnShape struct {
	Sessions, Turns, Systems, System, Question, Output int
	Think                                              time.Duration
}

var (
	multiTurnFull  = multiTurnShape{Sessions: 80, Turns: 6, Systems: 4, System: 400, Question: 100, Output: 48, Think: 500 * time.Millisecond}
	multiTurnQuick = multiTurnShape{Sessions: 24, Turns: 4, Systems: 2, System: 300, Question: 80, Output: 24, Think: 200 * time.Millisecond}
)

func multiTurn(src *textSource, sh multiTurnShape, chat bool, seed uint64) *workload {
	r := rand.New(rand.NewPCG(seed, 0xb))
	systems := make([]string, sh.Systems)
	for i := range systems {
		systems[i] = src.Text(r, sh.System)
	}
	ss := make([]session, sh.Sessions)
	for i := range ss {
		n := sh.Turns/2 + r.IntN(sh.Turns-sh.Turns/2+1)
		s := session{System: systems[r.IntN(len(systems))], Think: sh.Think, Group: i + 1}
		for range max(n, 1) {
			s.Turns = append(s.Turns, turn{User: src.Text(r, sh.Question), MaxTokens: sh.Output})
		}
		ss[i] = s
	}
	return &workload{Name: "multi-turn", Chat: chat, Sessions: ss,
		Desc: fmt.Sprintf("%d sessions × %d–%d turns, %d shared %d-token system prompts, %d-token questions, %d-token answers, %s think time",
			sh.Sessions, sh.Turns/2, sh.Turns, sh.Systems, sh.System, sh.Question, sh.Output, sh.Think)}
}

// poissonStarts returns n arrival offsets of a Poisson process of rate per second (seeded).
func poissonStarts(n int, rate float64, seed uint64) []time.Duration {
	r := rand.New(rand.NewPCG(seed, 0xc))
	out := make([]time.Duration, n)
	var t float64
	for i := range out {
		out[i] = time.Duration(t * float64(time.Second))
		t += -math.Log(1-r.Float64()) / rate
	}
	return out
}
